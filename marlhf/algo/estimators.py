"""Advantage estimators (``--advantage_estimator``): the critic's macro-action GAE and the critic-free
estimators GRPO, Dr. GRPO, RLOO, REINFORCE++ and Monte-Carlo credit per macro action.

Shapes: B rows (responses), A response tokens, M macro actions, N Monte-Carlo boundaries per row,
G rows per group (the samples of one prompt). `action_mask: (B, A) bool` is true on a prefix of each row.

The reward of a response comes in two parts, kept apart so that each estimator can treat them as its
algorithm says (`marlhf.algo.kl_rewards.token_rewards`, `marlhf.algo.kl_rewards.sequence_rewards`):

- `kl_rewards: (B, A)`: the per-token terms, `-kl_ctl * KL_t` (plus dense segment rewards), and
- `scores: (B,)`: the sequence-level reward, the outcome (clipped score plus any no-EOS penalty).

What ``--kl_ctl`` means. In every estimator it stays what it always was here, the coefficient beta of
the per-token KL reward `-beta * KL_t`; how the estimators use those rewards:

- ``gae``: in the rewards of macro-action GAE with the critic (MA-RLHF's own use).
- ``reinforce_pp``: in the rewards of the discounted return-to-go, before the global whitening
  (REINFORCE++, Hu 2025; OpenRLHF and verl put the KL in the reward for it).
- ``grpo``, ``dr_grpo``, ``rloo``: the group baseline applies to `scores` only (the KL is not part of
  the group statistics); the normalised outcome is placed on the last valid token and the KL rewards
  are added per token, and each token gets the discounted return-to-go of these rewards (OpenRLHF's
  convention for these estimators when the KL is in the reward). With ``--kl_ctl 0`` and gamma 1 this
  is the pure outcome estimator broadcast to the tokens. verl's GRPO default keeps the KL out of the
  reward and adds the GRPO paper's KL loss instead (`use_kl_loss`, coefficient 0.001, the k3
  estimator): that is ``--kl_ctl 0`` plus a loss term
  `coef * marlhf.algo.losses.agg_loss(marlhf.algo.kl_rewards.kl_penalty(logp, ref_logp, "k3"), mask, mode)` in the
  update (``--kl_ctl 0 --kl_loss_coef 0.001 --kl_loss_type k3``, `marlhf.stages.ppo.update.actor_step`);
  the estimator only sees the rewards.
- ``macro_mc``: a credit segment's advantage is V̂(end) - V̂(start) plus the KL rewards of its own
  tokens (undiscounted); the Monte-Carlo values V̂ estimate the expected outcome score.

The registry (:mod:`marlhf.algo.registry`, no torch, its names exported here too). Each estimator
is an :class:`Estimator` subclass registered under its CLI name with ``@register_estimator(name)``;
its class attributes say everything the trainer and the configuration ask of it (its label, what it
reads, its group size, ...). The built-in ones are declared there, with those attributes, and
implemented here, each class a subclass of its declaration registered in its place; an estimator of
a user's is one class in a file named by ``--plugin`` (:mod:`marlhf.plugins`). The Monte-Carlo
credit of ``macro_mc`` is :mod:`marlhf.algo.macro_mc`.

Batch-level estimators (``batch_level``: groups, whitening) must be called on the global batch, every
rank holding the gathered experience, so groups stay whole and the statistics do not depend on the
split over ranks.

Example: GRPO over two prompts with G = 2 samples each, rows of a group not adjacent.

>>> import torch
>>> mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]).bool()
>>> inputs = EstimatorInputs(
...     kl_rewards=torch.zeros(4, 3), scores=torch.tensor([1.0, 0.0, 3.0, 2.0]),
...     action_mask=mask, group_ids=torch.tensor([7, 5, 5, 7]))
>>> adv, ret = build_estimator("grpo")(inputs)
>>> [round(a, 4) for a in adv[:, 0].tolist()], ret
([-0.7071, -0.7071, 0.7071, 0.7071], None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from marlhf.algo.gae import gae
from marlhf.algo.losses import masked_whiten
from marlhf.algo.macro_gae import macro_advantages
from marlhf.algo.macro_mc import (
    MCBoundaries,
    MCValues,
    credit_segment_ids,
    macro_mc_advantages,
    select_mc_boundaries,
    select_spaced_mc_boundaries,
)
from marlhf.algo.registry import (
    ESTIMATOR_ALIASES,
    ESTIMATORS,
    GAE,
    GRPO,
    RLOO,
    DrGRPO,
    Estimator,
    EstimatorOptions,
    MacroMC,
    ReinforcePP,
    build_estimator,
    check_estimator_flags,
    check_gamma,
    estimator_class,
    estimator_implementation,
    estimators_help,
    group_size_help,
    register_estimator,
    resolve_estimator,
)
from marlhf.macro.segments import MacroSegments

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_ALIASES",
    "AdvantageEstimator",
    "Estimator",
    "EstimatorInputs",
    "EstimatorOptions",
    "MCBoundaries",
    "MCValues",
    "add_to_last_token",
    "build_estimator",
    "check_estimator_flags",
    "check_gamma",
    "credit_segment_ids",
    "estimator_class",
    "estimator_implementation",
    "estimators_help",
    "group_size_help",
    "group_normalised_scores",
    "leave_one_out_mean",
    "macro_mc_advantages",
    "outcome_advantages",
    "register_estimator",
    "reinforce_pp_advantages",
    "resolve_estimator",
    "returns_to_go",
    "select_mc_boundaries",
    "select_spaced_mc_boundaries",
]


# --------------------------------------------------------------------------------------------------
# inputs


@dataclass
class EstimatorInputs:
    """One batch as the estimators see it.

    Fields:
        kl_rewards: (B, A) float — per-token rewards besides the score: `-kl_ctl * KL_t` (+ dense);
            padding is ignored.
        scores: (B,) float — each response's sequence-level reward (the outcome).
        action_mask: (B, A) bool — response tokens, true on a prefix of each row.
        segments: the batch's macro actions (``gae``) | None.
        values: (B, A) float — the critic's V(s_t), the state before token t (``gae``) | None.
        group_ids: (B,) long — which prompt each row answers; rows of a group need not be adjacent
            (``grpo``, ``dr_grpo``, ``rloo``; ``macro_mc`` without prompt values) | None.
        mc: Monte-Carlo values at macro-action boundaries (``macro_mc``) | None.
    """

    kl_rewards: torch.Tensor
    scores: torch.Tensor
    action_mask: torch.Tensor
    segments: MacroSegments | None = None
    values: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    mc: MCValues | None = None

    def __post_init__(self) -> None:
        if self.action_mask.dim() != 2:
            raise ValueError(f"action_mask must be (B, A), got {tuple(self.action_mask.shape)}")
        B, A = self.action_mask.shape
        if self.kl_rewards.shape != (B, A):
            raise ValueError(
                f"kl_rewards must be (B, A) = {(B, A)}, got {tuple(self.kl_rewards.shape)}"
            )
        if self.scores.shape != (B,):
            raise ValueError(f"scores must be (B,) = ({B},), got {tuple(self.scores.shape)}")
        if self.values is not None and self.values.shape != (B, A):
            raise ValueError(f"values must be (B, A) = {(B, A)}, got {tuple(self.values.shape)}")
        if self.group_ids is not None and self.group_ids.shape != (B,):
            raise ValueError(f"group_ids must be (B,) = ({B},), got {tuple(self.group_ids.shape)}")


# --------------------------------------------------------------------------------------------------
# building blocks


def add_to_last_token(x: torch.Tensor, y: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """(B, A): `x` (0 on padding) with `y[b]` added on row b's last valid token; empty rows get
    nothing. The arithmetic of `marlhf.algo.kl_rewards.compose_rewards` (one addition on that token)."""
    mask = action_mask.bool()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    x = torch.where(mask, x, zero)
    if x.shape[1] == 0:
        return x
    n_valid = mask.sum(1)
    y = torch.where(n_valid > 0, y.to(x.dtype), zero)
    return x.scatter_add(1, (n_valid - 1).clamp(min=0)[:, None], y[:, None])


def returns_to_go(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, A) discounted return-to-go `R_t = sum_{t' >= t} gamma^(t' - t) r_t'` over each row's valid
    tokens, 0 on padding: GAE with no critic and lambda 1 (`marlhf.algo.gae.gae`)."""
    mask = action_mask.bool()
    returns, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)
    return returns


def _group_index(
    group_ids: torch.Tensor | None, B: int, name: str
) -> tuple[torch.Tensor, int, int]:
    """(inverse (B,) long in 0..P-1, P groups, G rows per group), or a clear error."""
    if group_ids is None:
        raise ValueError(
            f"--advantage_estimator {name} needs group ids (B,): the prompt each row answers, "
            "with --n_samples_per_prompt rows per prompt"
        )
    if group_ids.shape != (B,):
        raise ValueError(f"group_ids must be (B,) = ({B},), got {tuple(group_ids.shape)}")
    if B == 0:
        return group_ids.long(), 0, 0
    ids, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    G = int(counts.min())
    if int(counts.max()) != G:
        sizes = ", ".join(f"{int(i)}: {int(c)}" for i, c in list(zip(ids, counts, strict=True))[:8])
        raise ValueError(
            f"--advantage_estimator {name}: the groups differ in size (group id: rows — {sizes}); "
            "every prompt must bring --n_samples_per_prompt rows, and groups must stay whole "
            "(estimate on the gathered global batch)"
        )
    if G < 2:
        raise ValueError(
            f"--advantage_estimator {name} compares the samples of one prompt, but every group has "
            f"{G} row: set --n_samples_per_prompt to 2 or more"
        )
    return inverse, int(ids.numel()), G


def _group_sum(x: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(B,) the sum of `x` over each row's group."""
    return x.new_zeros(n_groups).index_add_(0, inverse, x)[inverse]


def group_normalised_scores(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale: bool = True,
    eps: float = 1e-6,
    name: str = "grpo",
) -> torch.Tensor:
    """(B,) GRPO's outcome advantage `(r_i - mean_g) / (std_g + eps)` (`scale`), or Dr. GRPO's
    `r_i - mean_g` (not `scale`), over the G rows of each row's group; std is Bessel-corrected
    (verl, OpenRLHF). Raises ValueError for G < 2 or unequal groups (`name`: the estimator in the
    message)."""
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    inverse, P, G = _group_index(group_ids, scores.shape[0], name)
    mean = _group_sum(scores, inverse, P) / G
    centred = scores - mean
    if not scale:
        return centred
    std = (_group_sum(centred.square(), inverse, P) / (G - 1)).sqrt()
    return centred / (std + eps)


def leave_one_out_mean(
    scores: torch.Tensor, group_ids: torch.Tensor, name: str = "rloo"
) -> torch.Tensor:
    """(B,) `mean_{j != i} r_j` over the other rows of row i's group (RLOO's baseline, Ahmadian et al.
    2024): an estimate of the prompt's value that does not depend on row i's own response."""
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    inverse, P, G = _group_index(group_ids, scores.shape[0], name)
    return (_group_sum(scores, inverse, P) - scores) / max(G - 1, 1)


def outcome_advantages(
    outcome: torch.Tensor, kl_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """(B, A) token advantages of an outcome estimator: the return-to-go of the rewards made of the
    KL rewards plus `outcome` (B,) on the last valid token. With gamma 1 and no KL every valid token
    gets `outcome`."""
    return returns_to_go(add_to_last_token(kl_rewards, outcome, action_mask), action_mask, gamma)


def reinforce_pp_advantages(
    kl_rewards: torch.Tensor, scores: torch.Tensor, action_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): returns `R_t` = discounted return-to-go of the per-token KL rewards
    with the score on the last valid token; advantages = `R_t` whitened (mean 0, std 1) over all valid
    tokens of the batch (call it on the global batch). Returns (advantages, returns), both (B, A)."""
    returns = returns_to_go(add_to_last_token(kl_rewards, scores, action_mask), action_mask, gamma)
    return masked_whiten(returns, action_mask), returns


# --------------------------------------------------------------------------------------------------
# the estimators and their registry


class AdvantageEstimator(Protocol):
    """An estimator as built: `(inputs) -> (advantages (B, A), returns (B, A) | None)` plus what it
    needs (the class attributes of :class:`Estimator`)."""

    name: str
    needs_critic: bool
    needs_segments: bool
    needs_groups: bool
    needs_mc: bool
    batch_level: bool
    loss_agg_mode: str | None

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]: ...


EstimatorFactory = Callable[[EstimatorOptions], AdvantageEstimator]


def _require(inputs: EstimatorInputs, name: str, *fields: str) -> None:
    missing = [f for f in fields if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"--advantage_estimator {name} needs {', '.join(missing)} in its inputs")


@register_estimator("gae")
@dataclass(frozen=True)
class GAEEstimator(GAE):
    """The critic with GAE over macro actions (`marlhf.algo.macro_gae.macro_advantages`); the score
    enters the last macro action whole. Returns (advantages, returns)."""

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        _require(inputs, self.name, "segments", "values")
        o = self.options
        return macro_advantages(
            inputs.kl_rewards,
            inputs.values,
            inputs.action_mask,
            inputs.segments,
            value_function=o.value_function,
            reward_agg=o.reward_agg,
            gamma=o.gamma,
            lam=o.lam,
            scores=inputs.scores,
        )


@register_estimator("grpo")
@dataclass(frozen=True)
class GRPOEstimator(GRPO):
    """GRPO (Shao et al. 2024): the group-normalised outcome `(r - mean_g) / (std_g + eps)`."""

    scale: ClassVar[bool] = True

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        outcome = group_normalised_scores(
            inputs.scores,
            inputs.group_ids,
            scale=self.scale,
            eps=self.options.group_eps,
            name=self.name,
        )
        adv = outcome_advantages(outcome, inputs.kl_rewards, inputs.action_mask, self.options.gamma)
        return adv, None


@register_estimator("dr_grpo")
@dataclass(frozen=True)
class DrGRPOEstimator(DrGRPO, GRPOEstimator):
    """Dr. GRPO (Liu et al. 2025): `r - mean_g`, GRPO's estimate without the std division; its loss
    has no length normalisation (``seq-mean-token-sum-norm``, a constant normaliser). Its attributes
    are its declaration's (:class:`marlhf.algo.registry.DrGRPO`, first in the order of bases)."""

    scale: ClassVar[bool] = False


@register_estimator("rloo")
@dataclass(frozen=True)
class RLOOEstimator(RLOO):
    """RLOO (Ahmadian et al. 2024): `r_i - mean_{j != i} r_j` over the row's group."""

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        baseline = leave_one_out_mean(inputs.scores, inputs.group_ids, self.name)
        outcome = inputs.scores.to(baseline.dtype) - baseline
        adv = outcome_advantages(outcome, inputs.kl_rewards, inputs.action_mask, self.options.gamma)
        return adv, None


@register_estimator("reinforce_pp")
@dataclass(frozen=True)
class ReinforcePPEstimator(ReinforcePP):
    """REINFORCE++ (`reinforce_pp_advantages`). Returns (whitened advantages, the returns)."""

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        return reinforce_pp_advantages(
            inputs.kl_rewards, inputs.scores, inputs.action_mask, self.options.gamma
        )


@register_estimator("macro_mc")
@dataclass(frozen=True)
class MacroMCEstimator(MacroMC):
    """Monte-Carlo credit per macro action (`macro_mc_advantages`). The trainer segments, chooses the
    boundaries with `select_mc_boundaries`, draws and scores the continuations and passes
    `EstimatorInputs.mc`; V̂(s_0) is `mc.prompt_values` or, if None, the leave-one-out mean of the
    row's group's scores (then `group_ids` is needed, and the estimator is batch-level)."""

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        _require(inputs, self.name, "mc")
        mc = inputs.mc
        prompt_values = mc.prompt_values
        if prompt_values is None and inputs.group_ids is None:
            raise ValueError(
                "--advantage_estimator macro_mc needs V̂ at the prompt: mc.prompt_values, or "
                "group_ids with --n_samples_per_prompt >= 2 (the leave-one-out group mean)"
            )
        if prompt_values is None:
            prompt_values = leave_one_out_mean(inputs.scores, inputs.group_ids, self.name)
        adv = macro_mc_advantages(
            inputs.kl_rewards,
            inputs.scores,
            inputs.action_mask,
            mc.boundaries,
            mc.values,
            prompt_values,
        )
        return adv, None
