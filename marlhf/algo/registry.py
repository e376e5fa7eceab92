"""The registry of advantage estimators (``--advantage_estimator``): what an estimator tells the
trainer and the configuration about itself, and how it is found, checked against the flags and
built. Plain data and the standard library, no torch: the configuration reads it, and ``--help``
and a flag's error come before torch is imported.

An estimator is an :class:`Estimator` subclass registered under its CLI name with
``@register_estimator(name, aliases=())``; its class attributes say everything the trainer and the
configuration ask of it: its label in run names, its description in ``--help``, what it reads (a
critic, macro actions, groups, Monte-Carlo values), the fewest samples per prompt it works with,
whether it gives each macro action its own advantage (``--macro_credit boundary``), the ``--gamma``
and ``--loss_agg_mode`` it is defined with (:func:`check_estimator_flags`). Built with the flags'
:class:`EstimatorOptions`, it estimates a batch: ``__call__(inputs) -> (advantages, returns)``
(:class:`marlhf.algo.estimators.EstimatorInputs`).

Where an estimator lives:

- **a built-in estimator** is declared here (its class with the attributes, and ``implementation =
  "package.module:Class"``) and implemented in :mod:`marlhf.algo.estimators` by a subclass that
  registers itself under the same name; :func:`estimator_implementation` imports it when the
  estimator is first built, and puts it in its entry's place;
- **an estimator of one's own** is one class with both, in a file ``--plugin`` names
  (:mod:`marlhf.plugins`), which may import torch at its top: it is imported only when named.

>>> resolve_estimator("reinforce++"), estimator_class("gae").needs_critic
('reinforce_pp', True)
>>> estimator_class("dr_grpo").label, estimator_class("dr_grpo").implementation
('Dr. GRPO', 'marlhf.algo.estimators:DrGRPOEstimator')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from marlhf.plugins import declared_implementation, implements_declaration

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_ALIASES",
    "GAE",
    "GRPO",
    "MTGRPO",
    "RLOO",
    "TURN_REWARDS",
    "DrGRPO",
    "Estimator",
    "EstimatorOptions",
    "MacroMC",
    "ReinforcePP",
    "build_estimator",
    "check_estimator_flags",
    "check_gamma",
    "estimator_class",
    "estimator_implementation",
    "estimators_help",
    "group_size_help",
    "register_estimator",
    "resolve_estimator",
]


@dataclass(frozen=True)
class EstimatorOptions:
    """The estimators' settings (from the trainer's flags).

    Fields:
        gamma: discount (``--gamma``); ``macro_mc`` is undiscounted and requires 1.
        lam: GAE lambda (``--lam``, ``gae`` only).
        value_function: macro value weights (``--value_function``, ``gae`` only).
        reward_agg: macro reward aggregation (``--macro_reward_agg``, ``gae`` only).
        group_eps: added to the group's std in ``grpo`` (verl's 1e-6).
    """

    gamma: float = 1.0
    lam: float = 0.95
    value_function: str = "equal"
    reward_agg: str = "sum"
    group_eps: float = 1e-6


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator: a registered subclass estimates a batch (``__call__``, with the
    flags' `options`) and tells the package about itself, as class attributes and class methods.

    Class attributes:
        name: its CLI name (set by :func:`register_estimator`).
        label: its name in run names and titles (``GRPO``; default: `name`).
        description: a few words listed by ``--advantage_estimator``'s help.
        needs_critic: reads `values` and returns the critic's targets (else no critic is built,
            trained or saved).
        needs_segments: reads `segments`.
        needs_groups: reads `group_ids` (the prompt each row answers).
        needs_mc: reads `mc` (the trainer draws continuations at macro-action boundaries).
        batch_level: reads across rows (groups, whitening): called on the global batch.
        loss_agg_mode: the ``--loss_agg_mode`` its algorithm prescribes, or None.
        min_group_size: the fewest samples per prompt (``--n_samples_per_prompt``) it works with.
        per_macro: gives each macro action its own advantage (``--macro_credit boundary`` places
            them on boundary tokens); else one advantage per response.
        fixed_gamma: the only ``--gamma`` it is defined with, or None.
        turn_rewards: how a multi-turn rollout's per-turn rewards (``--env``) enter
            (:func:`marlhf.algo.estimators.with_turn_rewards`): ``tokens`` (with the per-token
            rewards, each on its turn's last action token), ``outcome`` (summed into the
            sequence-level reward; the default) or ``own`` (read apart).
        needs_turns: reads a multi-turn rollout's turns (``--env``); refused without one.
        implementation: ``"package.module:Class"`` of the subclass that estimates, imported when
            the estimator is first built (the built-in ones); None: this class estimates.
    """

    options: EstimatorOptions
    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs_critic: ClassVar[bool] = False
    needs_segments: ClassVar[bool] = False
    needs_groups: ClassVar[bool] = False
    needs_mc: ClassVar[bool] = False
    batch_level: ClassVar[bool] = False
    loss_agg_mode: ClassVar[str | None] = None
    min_group_size: ClassVar[int] = 1
    per_macro: ClassVar[bool] = False
    fixed_gamma: ClassVar[float | None] = None
    turn_rewards: ClassVar[str] = "outcome"
    needs_turns: ClassVar[bool] = False
    implementation: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        check_gamma(type(self), self.options.gamma)

    def __call__(self, inputs: Any) -> tuple[Any, Any]:
        """``(advantages (B, A), returns (B, A) | None)`` of a batch
        (:class:`marlhf.algo.estimators.EstimatorInputs`)."""
        raise NotImplementedError(f"advantage estimator {self.name!r} estimates nothing")

    @classmethod
    def validate(cls, ppo: Any) -> None:
        """Raise a ``ValueError`` naming the flag when the PPO flags (``ppo``: the run's
        ``PPOConfig``) do not suit this estimator, beyond what its attributes say (checked by
        :func:`check_estimator_flags`)."""

    @classmethod
    def run_label(cls, macro: str, token_level: bool) -> str:
        """What a run of this estimator is called (``--macro_credit boundary`` adds its suffix):
        its `label`, with the rule's ``macro`` label (``n=5``) unless the rule is ``token_level``
        (``GRPO``, ``GRPO, macro n=5``)."""
        label = cls.label or cls.name
        return label if token_level else f"{label}, macro {macro}"


# how an estimator takes a multi-turn rollout's per-turn rewards (Estimator.turn_rewards)
TURN_REWARDS = ("tokens", "outcome", "own")

ESTIMATORS: dict[str, type[Estimator]] = {}
ESTIMATOR_ALIASES: dict[str, str] = {}


def register_estimator(
    name: str, aliases: tuple[str, ...] = ()
) -> Callable[[type[Estimator]], type[Estimator]]:
    """Class decorator: register an :class:`Estimator` subclass under its CLI name (and aliases).
    A name is registered once; only a built-in's implementation (a subclass of its declaration)
    takes the declaration's place."""

    def decorate(cls: type[Estimator]) -> type[Estimator]:
        if not (isinstance(cls, type) and issubclass(cls, Estimator)):
            raise TypeError(f"register_estimator({name!r}) decorates an Estimator subclass")
        if implements_declaration(ESTIMATORS, cls, name) and not aliases:
            cls.name = name
            ESTIMATORS[name] = cls
            return cls
        for key in (name, *aliases):
            if key in ESTIMATORS or key in ESTIMATOR_ALIASES:
                raise ValueError(f"advantage estimator {key!r} is registered twice")
        cls.name = name
        ESTIMATORS[name] = cls
        ESTIMATOR_ALIASES.update({alias: name for alias in aliases})
        return cls

    return decorate


def resolve_estimator(name: str) -> str:
    """The canonical name of `name` (an estimator or an alias); ValueError listing the valid names."""
    if name in ESTIMATORS:
        return name
    if name in ESTIMATOR_ALIASES:
        return ESTIMATOR_ALIASES[name]
    aliases = ", ".join(f"{a} = {c}" for a, c in sorted(ESTIMATOR_ALIASES.items()))
    raise ValueError(
        f"--advantage_estimator {name!r} is not known; valid: {', '.join(ESTIMATORS)} "
        f"(aliases: {aliases}; an estimator of your own: name its file with --plugin)"
    )


def estimator_class(name: str) -> type[Estimator]:
    """The class registered as `name` (or an alias): its attributes (for a built-in estimator not
    yet built, its declaration: nothing is imported)."""
    return ESTIMATORS[resolve_estimator(name)]


def estimator_implementation(name: str) -> type[Estimator]:
    """The class that estimates for `name` (or an alias), its declaration's implementation
    imported (:func:`marlhf.plugins.declared_implementation`); an unknown name:
    :func:`resolve_estimator`'s error."""
    canonical = resolve_estimator(name)
    return declared_implementation(ESTIMATORS, canonical, "--advantage_estimator", "estimator")


def build_estimator(name: str, options: EstimatorOptions | None = None) -> Any:
    """The estimator registered as `name` (or an alias) with `options` (default
    `EstimatorOptions()`): an :class:`Estimator` that estimates (its implementation imported)."""
    return estimator_implementation(name)(options or EstimatorOptions())


def check_gamma(cls: type[Estimator], gamma: float) -> None:
    """ValueError unless ``--gamma`` is the one estimator ``cls`` is defined with (if any)."""
    if cls.fixed_gamma is not None and gamma != cls.fixed_gamma:
        kind = "undiscounted" if cls.fixed_gamma == 1.0 else f"discounted by {cls.fixed_gamma:g}"
        raise ValueError(
            f"--advantage_estimator {cls.name} is {kind}: --gamma must be {cls.fixed_gamma:g}, "
            f"got {gamma}"
        )


def check_estimator_flags(name: str, ppo: Any) -> type[Estimator]:
    """The estimator ``name`` (or an alias) of a run, after checking the PPO flags (``ppo``: the
    run's ``PPOConfig``) against it: samples per prompt, ``--gamma``, ``--loss_agg_mode``, the
    critic's warm-up, then its own `Estimator.validate`.

    Raises:
        ValueError: naming the flag (an unknown name lists the registered ones).
    """
    cls = estimator_class(name)
    if ppo.n_samples_per_prompt < cls.min_group_size:
        raise ValueError(
            f"--advantage_estimator {name} compares the samples of one prompt: set "
            f"--n_samples_per_prompt to {cls.min_group_size} or more (got {ppo.n_samples_per_prompt})"
        )
    check_gamma(cls, ppo.gamma)
    own = cls.loss_agg_mode
    if own is not None and ppo.loss_agg_mode not in (None, own):
        raise ValueError(
            f"--advantage_estimator {cls.name} is defined with --loss_agg_mode {own}; "
            f"--loss_agg_mode {ppo.loss_agg_mode} contradicts it (leave it out)"
        )
    if not cls.needs_critic and ppo.critic_warmup_steps > 0:
        raise ValueError(
            f"--critic_warmup_steps {ppo.critic_warmup_steps}: --advantage_estimator {cls.name} "
            "trains no critic"
        )
    cls.validate(ppo)
    return cls


def estimators_help() -> str:
    """The registered estimators with their descriptions and aliases, for ``--help``."""
    listed = ", ".join(f"`{n}` ({c.description or n})" for n, c in ESTIMATORS.items())
    critics = " and ".join(f"`{n}`" for n, c in ESTIMATORS.items() if c.needs_critic)
    aliases = ", ".join(f"{a}={c}" for a, c in sorted(ESTIMATOR_ALIASES.items()))
    return (
        f"How advantages are made (marlhf.algo.estimators): {listed}; or one a --plugin file "
        f"registers. Only {critics} build{'s' * (' and ' not in critics)} a critic. "
        f"Aliases: {aliases}."
    )


def group_size_help() -> str:
    """Which registered estimators need several samples per prompt, for ``--help``: ``grpo,
    dr_grpo, rloo and mt_grpo need G >= 2.``"""
    by_size: dict[int, list[str]] = {}
    for name, cls in ESTIMATORS.items():
        if cls.min_group_size > 1:
            by_size.setdefault(cls.min_group_size, []).append(name)
    parts = []
    for size, names in by_size.items():
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        parts.append(f"{listed} need{'s' * (len(names) == 1)} G >= {size}.")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------
# the built-in estimators, in the order --help lists them (implemented in marlhf.algo.estimators,
# where each one's docstring gives its algorithm)


@register_estimator("gae")
class GAE(Estimator):
    """The critic with GAE over macro actions."""

    label = "PPO"
    description = "the critic, GAE over macro actions"
    needs_critic = True
    needs_segments = True
    per_macro = True
    turn_rewards = "tokens"
    implementation = "marlhf.algo.estimators:GAEEstimator"

    @classmethod
    def run_label(cls, macro: str, token_level: bool) -> str:
        """``PPO`` over tokens, ``MA-PPO n=5`` over macro actions."""
        return "PPO" if token_level else f"MA-PPO {macro}"


@register_estimator("grpo", aliases=("group_norm",))
class GRPO(Estimator):
    """GRPO (Shao et al. 2024): the group-normalised outcome."""

    label = "GRPO"
    description = "group-normalised outcome over --n_samples_per_prompt samples"
    needs_groups = True
    batch_level = True
    min_group_size = 2
    implementation = "marlhf.algo.estimators:GRPOEstimator"


@register_estimator("dr_grpo", aliases=("dr-grpo",))
class DrGRPO(GRPO):
    """Dr. GRPO (Liu et al. 2025): no std division, no length normalisation in the loss."""

    label = "Dr. GRPO"
    description = "no std division, constant loss normaliser"
    loss_agg_mode = "seq-mean-token-sum-norm"
    implementation = "marlhf.algo.estimators:DrGRPOEstimator"


@register_estimator("rloo")
class RLOO(Estimator):
    """RLOO (Ahmadian et al. 2024): a leave-one-out baseline over the row's group."""

    label = "RLOO"
    description = "leave-one-out baseline"
    needs_groups = True
    batch_level = True
    min_group_size = 2
    implementation = "marlhf.algo.estimators:RLOOEstimator"


@register_estimator("mt_grpo", aliases=("mt-grpo",))
class MTGRPO(Estimator):
    """MT-GRPO (Zeng et al. 2025): per-turn group-normalised rewards plus the outcome's."""

    label = "MT-GRPO"
    description = (
        "per turn: the group-normalised outcome plus the turn's group-normalised reward (--env)"
    )
    needs_groups = True
    needs_turns = True
    batch_level = True
    min_group_size = 2
    turn_rewards = "own"
    implementation = "marlhf.algo.estimators:MTGRPOEstimator"


@register_estimator("reinforce_pp", aliases=("reinforce++", "reinforce_plus_plus"))
class ReinforcePP(Estimator):
    """REINFORCE++ (Hu 2025): returns whitened over the batch."""

    label = "REINFORCE++"
    description = "REINFORCE++: KL in the reward, returns whitened over the batch"
    batch_level = True
    turn_rewards = "tokens"
    implementation = "marlhf.algo.estimators:ReinforcePPEstimator"


@register_estimator("macro_mc", aliases=("macro-mc",))
class MacroMC(Estimator):
    """Monte-Carlo credit per macro action."""

    label = "MA-MC"
    description = (
        "Monte-Carlo values at macro-action boundaries: --mc_rollouts continuations of the current "
        "policy"
    )
    needs_segments = True
    needs_groups = True
    needs_mc = True
    batch_level = True
    per_macro = True
    fixed_gamma = 1.0  # undiscounted: V̂ estimates the final score
    implementation = "marlhf.algo.estimators:MacroMCEstimator"

    @classmethod
    def run_label(cls, macro: str, token_level: bool) -> str:
        """``MA-MC n=5``, the rule always named."""
        return f"MA-MC {macro}"
