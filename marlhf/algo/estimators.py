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
from marlhf.algo.names import ESTIMATOR_ALIASES, ESTIMATOR_TRAITS, resolve_estimator
from marlhf.macro.segments import MacroSegments

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_ALIASES",
    "AdvantageEstimator",
    "EstimatorInputs",
    "EstimatorOptions",
    "MCBoundaries",
    "MCValues",
    "add_to_last_token",
    "build_estimator",
    "credit_segment_ids",
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
class MCBoundaries:
    """The states at which ``macro_mc`` draws continuations: per row, up to N boundaries between macro
    actions (`select_mc_boundaries`). Boundary (b, n) is the state s = (prompt_b, response_b[:p]) with
    p = ``positions[b, n]``: the state before token p, where macro action ``macro_index[b, n]`` begins.

    Fields:
        positions: (B, N) long — token positions, 1 <= p < the row's length, increasing along a row;
            -1 where invalid.
        mask: (B, N) bool — valid boundaries, a prefix of each row.
        macro_index: (B, N) long — the macro action that begins at each boundary (>= 1); -1 where
            invalid.
    """

    positions: torch.Tensor
    mask: torch.Tensor
    macro_index: torch.Tensor


@dataclass
class MCValues:
    """What the trainer supplies to ``macro_mc`` after its rollouts.

    For every valid boundary (b, n) of `boundaries` the trainer draws K continuations from the current
    policy, starting from (prompt_b, response_b[:positions[b, n]]) and sampled like the responses
    themselves (same temperature and length limit, the limit counting the prefix), scores each
    continued response exactly as the responses' `scores` are made (reward model score, clipped, plus
    the no-EOS penalty; no KL), and passes the mean.

    Fields:
        boundaries: the `MCBoundaries` the continuations were drawn at.
        values: (B, N) float — V̂ at each boundary, the mean score of its K continuations; ignored
            where `boundaries.mask` is false.
        prompt_values: (B,) float | None — V̂(s_0) at each row's prompt (the mean score of K fresh
            responses to it). None: the leave-one-out mean of the other scores of the row's group
            (`EstimatorInputs.group_ids`), which are such responses already.
    """

    boundaries: MCBoundaries
    values: torch.Tensor
    prompt_values: torch.Tensor | None = None


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
# macro_mc: Monte-Carlo values at macro-action boundaries (SPO-chain / VinePPO over macro actions)


def select_mc_boundaries(segments: MacroSegments, max_boundaries: int) -> MCBoundaries:
    """The boundaries at which ``macro_mc`` draws continuations, at most `max_boundaries` per row.

    Row b's macro actions 0..K-1 begin at the states s_0 (the prompt), s_1, ..., s_{K-1}; s_K is the
    end of the response. The candidates are the K - 1 interior states s_1..s_{K-1} (s_0's value
    comes from the group or prompt rollouts, s_K's is the response's own score). If they number at most
    `max_boundaries`, all are chosen; otherwise C = `max_boundaries` of them, evenly spaced over the
    macro actions: s_k with k = floor((i + 1) * K / (C + 1)), i = 0..C-1 (distinct, in 1..K-1). The
    macro actions between two chosen boundaries are merged into one credit segment that shares one
    advantage (`credit_segment_ids`). `max_boundaries` 0 leaves the whole response one segment.

    Args:
        segments: the batch's macro layout (`marlhf.macro.segments.build_segments`).
        max_boundaries: C >= 0 (``--mc_max_boundaries``).

    Returns:
        `MCBoundaries` with N = the largest number chosen in a row (0 if none).

    >>> import torch
    >>> from marlhf.macro.segments import build_segments
    >>> seg = build_segments(torch.tensor([[1, 1, 1, 1, 1, 1]]).bool(), torch.ones(1, 6).bool())
    >>> select_mc_boundaries(seg, 2).positions.tolist()  # K = 6: s_2 and s_4
    [[2, 4]]
    """
    if max_boundaries < 0:
        raise ValueError(f"--mc_max_boundaries must be >= 0, got {max_boundaries}")
    count = segments.count
    B, M = segments.start.shape
    interior = (count - 1).clamp(min=0)  # (B,)
    n_chosen = interior.clamp(max=max_boundaries)
    N = int(n_chosen.max()) if B > 0 else 0
    i = torch.arange(N, device=count.device)[None, :]  # (1, N)
    spread = (i + 1) * count[:, None] // (max_boundaries + 1)
    k = torch.where(interior[:, None] <= max_boundaries, i + 1, spread)  # (B, N)
    valid = i < n_chosen[:, None]
    k = torch.where(valid, k, 0).clamp(max=M - 1)
    positions = torch.where(valid, segments.start.gather(1, k), -1)
    return MCBoundaries(positions=positions, mask=valid, macro_index=torch.where(valid, k, -1))


def select_spaced_mc_boundaries(
    segments: MacroSegments, max_boundaries: int, spacing: int
) -> MCBoundaries:
    """``macro_mc``'s boundaries at fixed token spacing: for i = 1..C (C = `max_boundaries`), the
    first interior macro-action start at or after token i * `spacing`; a start chosen twice counts
    once, so a row has at most C.

    Why not spread C boundaries evenly over the response's own K macro actions
    (`select_mc_boundaries`): K is decided by the whole response, so where a token's credit
    segment begins and ends, i.e. the baseline V̂(b_j) it is compared with, would depend on the
    tokens the policy samples after it, an action-dependent baseline that biases the gradient when
    the policy decides how many macro actions there are (the per-index bias that verl's RFC 7244
    finds in per-turn advantage normalisation; benchmarks/credit_bias.py measures it). Here whether the state before token p is a boundary
    depends only on where macro actions start up to p: with a rule whose starts are known before
    the token at them is sampled (fixed, randomized, entropy, lowprob cutting after), the chosen
    states are stopping times and V̂(b_{j+1}) - V̂(b_j) is an unbiased advantage.

    >>> import torch
    >>> from marlhf.macro.segments import build_segments
    >>> ends = torch.tensor([[0, 1, 0, 1, 0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 1, 0, 0, 0, 0, 0]])
    >>> seg = build_segments(ends.bool(), torch.tensor([[1] * 10, [1] * 5 + [0] * 5]).bool())
    >>> b = select_spaced_mc_boundaries(seg, 3, 3)  # the first starts at or after tokens 3, 6, 9
    >>> b.positions.tolist(), b.macro_index.tolist()  # no start at or after 9; row 1 ends at 5
    ([[4, 6], [4, -1]], [[2, 3], [2, -1]])
    """
    if max_boundaries < 0:
        raise ValueError(f"--mc_max_boundaries must be >= 0, got {max_boundaries}")
    if spacing < 1:
        raise ValueError(f"--mc_boundary_spacing must be >= 1 token, got {spacing}")
    count, start = segments.count, segments.start
    B, M = start.shape
    C = max_boundaries
    k = torch.arange(M, device=start.device)[None, :]
    big = torch.iinfo(torch.long).max
    # each row's macro starts, increasing: macro 0 (the prompt) below every target, none past count
    starts = torch.where(k == 0, -1, torch.where(segments.mask, start, big))
    targets = torch.arange(1, C + 1, device=start.device)[None, :].expand(B, C) * spacing
    chosen = torch.searchsorted(starts.contiguous(), targets.contiguous())  # (B, C)
    valid = chosen < count[:, None]
    if C > 1:
        valid[:, 1:] &= chosen[:, 1:] != chosen[:, :-1]
    # valid boundaries first, in order (a stable sort of the invalid flag)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    valid, chosen = valid.gather(1, order), chosen.gather(1, order)
    N = int(valid.sum(1).max()) if B > 0 and C > 0 else 0
    valid, chosen = valid[:, :N], chosen[:, :N].clamp(max=M - 1)
    positions = torch.where(valid, start.gather(1, chosen), -1)
    return MCBoundaries(positions=positions, mask=valid, macro_index=torch.where(valid, chosen, -1))


def _check_boundaries(boundaries: MCBoundaries, action_mask: torch.Tensor) -> None:
    B = action_mask.shape[0]
    pos, bmask = boundaries.positions, boundaries.mask.bool()
    if pos.dim() != 2 or pos.shape[0] != B or bmask.shape != pos.shape:
        raise ValueError(
            f"MC boundaries: positions {tuple(pos.shape)} and mask {tuple(bmask.shape)} must both be "
            f"(B, N) with B = {B}"
        )
    n_valid = action_mask.bool().sum(1, keepdim=True)
    bad = bmask & ((pos < 1) | (pos >= n_valid))
    if pos.shape[1] > 1:
        bad[:, 1:] |= bmask[:, 1:] & ((pos[:, 1:] <= pos[:, :-1]) | ~bmask[:, :-1])
    if bool(bad.any()):
        rows = torch.nonzero(bad.any(1)).flatten().tolist()
        raise ValueError(
            "MC boundaries must be a prefix of each row at increasing positions inside the response "
            f"(1 <= p < length); not so in rows {rows[:10]}"
        )


def credit_segment_ids(boundaries: MCBoundaries, action_mask: torch.Tensor) -> torch.Tensor:
    """(B, A) long: the credit segment of each token, the number of the row's boundaries at or before
    it (0..n_b), -1 on padding. Segment j runs from boundary j to boundary j + 1 (boundary 0 is the
    prompt, boundary n_b + 1 the end of the response)."""
    mask = action_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device)
    before = boundaries.mask.bool()[:, None, :] & (
        boundaries.positions[:, None, :] <= positions[None, :, None]
    )  # (B, A, N)
    return torch.where(mask, before.sum(-1), -1)


def macro_mc_advantages(
    kl_rewards: torch.Tensor,
    scores: torch.Tensor,
    action_mask: torch.Tensor,
    boundaries: MCBoundaries,
    mc_values: torch.Tensor,
    prompt_values: torch.Tensor,
) -> torch.Tensor:
    """Monte-Carlo credit per credit segment, broadcast to its tokens (SPO-chain, Guo et al. 2025;
    VinePPO, Kazemnejad et al. 2024; here over macro actions):

        A_j = V̂(b_{j+1}) - V̂(b_j) + sum_{t in segment j} kl_rewards_t

    with V̂(b_0) = `prompt_values`, V̂(b_1..b_n) = `mc_values` at the row's boundaries and
    V̂(b_{n+1}) = `scores`, the response's own final score (terminal). Undiscounted. With no
    boundary this is `scores - prompt_values` plus the row's KL rewards on every token.

    Args:
        kl_rewards: (B, A) float. scores: (B,) float. action_mask: (B, A) bool.
        boundaries: `MCBoundaries` (N per row). mc_values: (B, N) float, finite where valid.
        prompt_values: (B,) float.

    Returns:
        (B, A) float advantages, 0 on padding.
    """
    mask = action_mask.bool()
    B, A = mask.shape
    _check_boundaries(boundaries, mask)
    N = boundaries.positions.shape[1]
    bmask = boundaries.mask.bool()
    if mc_values.shape != (B, N) or prompt_values.shape != (B,) or scores.shape != (B,):
        raise ValueError(
            f"mc_values {tuple(mc_values.shape)}, prompt_values {tuple(prompt_values.shape)} and "
            f"scores {tuple(scores.shape)} must be (B, N) = {(B, N)}, (B,) and (B,)"
        )
    if not bool(torch.isfinite(mc_values[bmask]).all()):
        rows = torch.nonzero((bmask & ~torch.isfinite(mc_values)).any(1)).flatten().tolist()
        raise ValueError(f"MC values are not finite at valid boundaries of rows {rows[:10]}")
    dtype = torch.promote_types(kl_rewards.dtype, torch.float32)
    # V̂ at the row's credit boundaries: [prompt, b_1..b_n, final score] in columns 0..n + 1
    ext = torch.zeros(B, N + 2, dtype=dtype, device=mask.device)
    ext[:, 0] = prompt_values.to(dtype)
    ext[:, 1 : N + 1] = torch.where(bmask, mc_values.to(dtype), 0.0)
    ext.scatter_(1, (bmask.sum(1) + 1)[:, None], scores.to(dtype)[:, None])
    cid = credit_segment_ids(boundaries, mask).clamp(min=0)  # (B, A)
    kl = torch.where(mask, kl_rewards.to(dtype), 0.0)
    kl_segment = torch.zeros(B, N + 1, dtype=dtype, device=mask.device).scatter_add_(1, cid, kl)
    adv = ext.gather(1, cid + 1) - ext.gather(1, cid) + kl_segment.gather(1, cid)
    return torch.where(mask, adv, 0.0)


# --------------------------------------------------------------------------------------------------
# the estimators and their registry


class AdvantageEstimator(Protocol):
    """An estimator: `(inputs) -> (advantages (B, A), returns (B, A) | None)` plus what it needs.

    Attributes:
        name: its CLI name.
        needs_critic: reads `values`, returns the critic's targets (else no critic is built).
        needs_segments: reads `segments`.
        needs_groups: reads `group_ids` (rows per prompt: ``--n_samples_per_prompt`` >= 2).
        needs_mc: reads `mc` (continuations at `select_mc_boundaries`).
        batch_level: reads across rows (groups, whitening): call it on the global batch.
        loss_agg_mode: the ``--loss_agg_mode`` its algorithm prescribes, or None.
    """

    name: str
    needs_critic: bool
    needs_segments: bool
    needs_groups: bool
    needs_mc: bool
    batch_level: bool
    loss_agg_mode: str | None

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]: ...


EstimatorFactory = Callable[[EstimatorOptions], AdvantageEstimator]
ESTIMATORS: dict[str, EstimatorFactory] = {}


def register_estimator(name: str) -> Callable[[EstimatorFactory], EstimatorFactory]:
    """Class decorator: register an estimator under its CLI name. Its aliases and what it needs
    (``needs_critic``, ...) are declared in :data:`marlhf.algo.names.ESTIMATOR_TRAITS` (the
    configuration reads them there, without torch) and set on the class here."""

    def decorate(factory: EstimatorFactory) -> EstimatorFactory:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        if name not in ESTIMATOR_TRAITS:
            raise ValueError(
                f"advantage estimator {name!r} has no traits in marlhf.algo.names.ESTIMATOR_TRAITS"
            )
        for trait, value in vars(ESTIMATOR_TRAITS[name]).items():
            setattr(factory, trait, value)
        ESTIMATORS[name] = factory
        return factory

    return decorate


def build_estimator(name: str, options: EstimatorOptions | None = None) -> AdvantageEstimator:
    """The estimator registered as `name` (or an alias) with `options` (default `EstimatorOptions()`)."""
    return ESTIMATORS[resolve_estimator(name)](options or EstimatorOptions())


def _require(inputs: EstimatorInputs, name: str, *fields: str) -> None:
    missing = [f for f in fields if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"--advantage_estimator {name} needs {', '.join(missing)} in its inputs")


@dataclass(frozen=True)
class _Estimator:
    options: EstimatorOptions
    name: ClassVar[str] = ""
    needs_critic: ClassVar[bool] = False
    needs_segments: ClassVar[bool] = False
    needs_groups: ClassVar[bool] = False
    needs_mc: ClassVar[bool] = False
    batch_level: ClassVar[bool] = False
    loss_agg_mode: ClassVar[str | None] = None


@register_estimator("gae")
@dataclass(frozen=True)
class GAEEstimator(_Estimator):
    """The critic with GAE over macro actions (`marlhf.algo.macro_gae.macro_advantages`); the score
    enters the last macro action whole. Returns (advantages, returns)."""

    name: ClassVar[str] = "gae"

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
class GRPOEstimator(_Estimator):
    """GRPO (Shao et al. 2024): the group-normalised outcome `(r - mean_g) / (std_g + eps)`."""

    name: ClassVar[str] = "grpo"
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
class DrGRPOEstimator(GRPOEstimator):
    """Dr. GRPO (Liu et al. 2025): `r - mean_g`, no std division; its loss has no length
    normalisation (``seq-mean-token-sum-norm``, a constant normaliser)."""

    name: ClassVar[str] = "dr_grpo"
    scale: ClassVar[bool] = False


@register_estimator("rloo")
@dataclass(frozen=True)
class RLOOEstimator(_Estimator):
    """RLOO (Ahmadian et al. 2024): `r_i - mean_{j != i} r_j` over the row's group."""

    name: ClassVar[str] = "rloo"

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        baseline = leave_one_out_mean(inputs.scores, inputs.group_ids, self.name)
        outcome = inputs.scores.to(baseline.dtype) - baseline
        adv = outcome_advantages(outcome, inputs.kl_rewards, inputs.action_mask, self.options.gamma)
        return adv, None


@register_estimator("reinforce_pp")
@dataclass(frozen=True)
class ReinforcePPEstimator(_Estimator):
    """REINFORCE++ (`reinforce_pp_advantages`). Returns (whitened advantages, the returns)."""

    name: ClassVar[str] = "reinforce_pp"

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        return reinforce_pp_advantages(
            inputs.kl_rewards, inputs.scores, inputs.action_mask, self.options.gamma
        )


@register_estimator("macro_mc")
@dataclass(frozen=True)
class MacroMCEstimator(_Estimator):
    """Monte-Carlo credit per macro action (`macro_mc_advantages`). The trainer segments, chooses the
    boundaries with `select_mc_boundaries`, draws and scores the continuations and passes
    `EstimatorInputs.mc`; V̂(s_0) is `mc.prompt_values` or, if None, the leave-one-out mean of the
    row's group's scores (then `group_ids` is needed, and the estimator is batch-level)."""

    name: ClassVar[str] = "macro_mc"

    def __call__(self, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        _require(inputs, self.name, "mc")
        if self.options.gamma != 1.0:
            raise ValueError(
                f"--advantage_estimator macro_mc is undiscounted; --gamma must be 1, got "
                f"{self.options.gamma}"
            )
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
