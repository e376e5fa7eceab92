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

Multi-turn rollouts (``--env``) bring a third part, the environment's per-turn rewards, each on its
turn's last action token; each estimator says how they enter (``Estimator.turn_rewards``,
:func:`with_turn_rewards`): with the per-token rewards (``gae``, ``reinforce_pp``: each turn's
reward reaches the tokens before it through the return), summed into the outcome (``grpo``,
``dr_grpo``, ``rloo``: the episode's total reward is what the group compares), or apart
(``mt_grpo``: each turn's reward normalised over the group's same turn,
:func:`per_turn_advantages`).

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
from dataclasses import dataclass, replace
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
    MTGRPO,
    RLOO,
    TURN_REWARDS,
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
    "per_turn_advantages",
    "register_estimator",
    "reinforce_pp_advantages",
    "resolve_estimator",
    "returns_to_go",
    "select_mc_boundaries",
    "select_spaced_mc_boundaries",
    "with_turn_rewards",
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
        turn_rewards: (B, A) float — a multi-turn rollout's per-turn rewards, each on its turn's
            last action token, 0 elsewhere, for an estimator that reads them apart
            (``turn_rewards = "own"``: ``mt_grpo``; :func:`with_turn_rewards`) | None.
        turn_end: (B, A) bool — each turn's last action token (with `turn_rewards`) | None.
        turn_index: (B, A) long — each action's turn, 1, 2, ...; 0 on padding (with
            `turn_rewards`) | None.
    """

    kl_rewards: torch.Tensor
    scores: torch.Tensor
    action_mask: torch.Tensor
    segments: MacroSegments | None = None
    values: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    mc: MCValues | None = None
    turn_rewards: torch.Tensor | None = None
    turn_end: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None

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
        for name in ("turn_rewards", "turn_end", "turn_index"):
            x = getattr(self, name)
            if x is not None and x.shape != (B, A):
                raise ValueError(f"{name} must be (B, A) = {(B, A)}, got {tuple(x.shape)}")


def with_turn_rewards(
    inputs: EstimatorInputs,
    how: str,
    turn_rewards: torch.Tensor,
    turn_end: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
) -> EstimatorInputs:
    """``inputs`` with a multi-turn rollout's per-turn rewards ``turn_rewards`` (B, A) (each on its
    turn's last action token) where the estimator takes them (``how``, its ``turn_rewards``):

    - ``tokens``: added to ``kl_rewards``, a reward on the turn's last token like any per-token
      reward (``gae``: the critic's returns and the macro actions' rewards hold them;
      ``reinforce_pp``: in the return-to-go of each earlier token);
    - ``outcome``: their sum over the row added to ``scores``, the episode's total reward as the
      sequence-level reward (``grpo``, ``dr_grpo``, ``rloo``: the group compares episodes);
    - ``own``: set as ``inputs.turn_rewards`` with ``turn_end`` and ``turn_index`` (``mt_grpo``).

    >>> mask = torch.tensor([[True, True, True]])
    >>> inputs = EstimatorInputs(torch.zeros(1, 3), torch.tensor([1.0]), mask)
    >>> turns = torch.tensor([[0.0, 0.5, 2.0]])
    >>> with_turn_rewards(inputs, "outcome", turns).scores.tolist()
    [3.5]
    >>> with_turn_rewards(inputs, "tokens", turns).kl_rewards.tolist()
    [[0.0, 0.5, 2.0]]
    """
    if how not in TURN_REWARDS:
        raise ValueError(f"turn_rewards must be one of {TURN_REWARDS}, got {how!r}")
    mask = inputs.action_mask.bool()
    dtype = torch.promote_types(inputs.kl_rewards.dtype, torch.float32)
    r = torch.where(mask, turn_rewards.to(dtype), torch.zeros((), dtype=dtype))
    if how == "tokens":
        return replace(inputs, kl_rewards=inputs.kl_rewards.to(dtype) + r)
    if how == "outcome":
        return replace(inputs, scores=inputs.scores.to(dtype) + r.sum(1))
    if turn_end is None or turn_index is None:
        raise ValueError("per-turn rewards read apart need turn_end and turn_index")
    return replace(inputs, turn_rewards=r, turn_end=turn_end.bool(), turn_index=turn_index.long())


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


def per_turn_advantages(
    scores: torch.Tensor,
    turn_rewards: torch.Tensor,
    turn_end: torch.Tensor,
    turn_index: torch.Tensor,
    action_mask: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float = 1e-6,
    name: str = "mt_grpo",
) -> torch.Tensor:
    """(B, A) MT-GRPO's token advantages (Zeng et al. 2025, arXiv 2505.11821, turn-level credit
    assignment; their two-turn rule `A_1 = Â^T + Â^O`, `A_2 = Â^O` with lambda 1, for any number of
    turns). Row i of group g has K_i turns with rewards r_{i,1..K_i} (``turn_rewards`` on each
    turn's last action token) and a sequence-level reward s_i (``scores``):

        outcome  O_i = s_i + r_{i,K_i}                       (the last turn's reward is the outcome)
        Â^O_i = (O_i - mean_g O) / (std_g O + eps)           (GRPO over the G rows of g)
        Â^T_{i,k} = (r_{i,k} - mean_{g,k} r) / (std_{g,k} r + eps)   for k < K_i
                    over the rows j of g that have an intermediate turn k (k < K_j); 0 where
                    fewer than two have one
        A_{i,t} = Â^O_i + Â^T_{i,k(t)}  for a token t of an intermediate turn k(t) < K_i,
                  Â^O_i                 for a token of the last turn

    (std Bessel-corrected, as in :func:`group_normalised_scores`). The turn term is a baseline per
    turn *index*: when the policy decides how many turns an episode has, which rows share turn k's
    statistics depends on the row's own later choices (verl RFC #7244), and the estimator is
    biased (``benchmarks/credit_bias.py``, the turns toy; with a fixed number of turns it is
    GRPO's estimate per turn).

    >>> mask = torch.ones(4, 2, dtype=torch.bool)
    >>> end = torch.tensor([[True, True]] * 4)
    >>> index = torch.tensor([[1, 2]] * 4)
    >>> r = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    >>> a = per_turn_advantages(torch.zeros(4), r, end, index, mask, torch.zeros(4))
    >>> [[round(x, 3) for x in row] for row in a.tolist()]
    [[1.732, 0.866], [0.0, 0.866], [0.0, -0.866], [-1.732, -0.866]]
    """
    mask = action_mask.bool()
    dtype = torch.promote_types(turn_rewards.dtype, torch.float32)
    rewards = torch.where(mask, turn_rewards.to(dtype), torch.zeros((), dtype=dtype))
    ends = turn_end.bool() & mask
    index = torch.where(mask, turn_index.long(), 0)
    n_turns = index.amax(1) if index.shape[1] else index.new_zeros(index.shape[0])  # K_i
    last = ends & (index == n_turns[:, None])
    outcome = scores.to(dtype) + (rewards * last).sum(1)
    adv = group_normalised_scores(outcome, group_ids, eps=eps, name=name)  # (B,)
    inverse, P, _ = _group_index(group_ids, mask.shape[0], name)
    middle = ends & (index < n_turns[:, None])  # intermediate turns' last tokens
    K = int(n_turns.max()) + 1 if n_turns.numel() else 1
    key = inverse[:, None] * K + index  # (B, A) one bucket per (group, turn)
    k, r = key[middle], rewards[middle]
    count = torch.zeros(P * K, dtype=dtype).index_add_(0, k, torch.ones_like(r))
    mean = torch.zeros(P * K, dtype=dtype).index_add_(0, k, r) / count.clamp(min=1)
    centred = r - mean[k]
    var = torch.zeros(P * K, dtype=dtype).index_add_(0, k, centred.square())
    std = (var / (count - 1).clamp(min=1)).sqrt()
    term = torch.where(count[k] >= 2, centred / (std[k] + eps), torch.zeros((), dtype=dtype))
    per_turn = torch.zeros(mask.shape[0], K, dtype=dtype)  # (B, K) Â^T of each row's turns
    rows = torch.nonzero(middle)[:, 0]
    per_turn[rows, index[middle]] = term
    tokens = torch.where(mask, per_turn.gather(1, index), torch.zeros((), dtype=dtype))
    return torch.where(mask, adv[:, None] + tokens, torch.zeros((), dtype=dtype))


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


@register_estimator("mt_grpo")
@dataclass(frozen=True)
class MTGRPOEstimator(MTGRPO):
    """MT-GRPO (Zeng et al. 2025): each token's advantage is the group-normalised outcome plus its
    turn's group-normalised reward (:func:`per_turn_advantages`), plus the return-to-go of the KL
    rewards (as ``grpo``'s). Needs a multi-turn rollout's per-turn rewards."""

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        _require(inputs, self.name, "turn_rewards", "turn_end", "turn_index", "group_ids")
        adv = per_turn_advantages(
            inputs.scores, inputs.turn_rewards, inputs.turn_end, inputs.turn_index,
            inputs.action_mask, inputs.group_ids, self.options.group_eps, self.name,
        )  # fmt: skip
        kl = returns_to_go(inputs.kl_rewards, inputs.action_mask, self.options.gamma)
        return adv + kl, None


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
