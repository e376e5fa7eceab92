"""Monte-Carlo credit per macro action (``--advantage_estimator macro_mc``: SPO-chain, Guo et al.
2025; VinePPO, Kazemnejad et al. 2024; here over macro actions): the states between macro actions at
which the trainer draws continuations, the credit segments they cut a response into, and the
advantage of each segment from the Monte-Carlo values there.

Shapes: B rows, A response tokens, M macro actions, N Monte-Carlo boundaries per row.
`action_mask: (B, A) bool` is true on a prefix of each row. The estimator that reads them is
:class:`marlhf.algo.estimators.MacroMCEstimator`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marlhf.macro.segments import MacroSegments

__all__ = [
    "MCBoundaries",
    "MCValues",
    "credit_segment_ids",
    "macro_mc_advantages",
    "select_mc_boundaries",
    "select_spaced_mc_boundaries",
]


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
