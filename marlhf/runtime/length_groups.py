"""Rows grouped by length, so that the forward passes of scoring and training compute little padding.

A rollout's rows are flush-left and right-padded to the longest row, so one forward pass over the
batch computes ``B × T`` positions, while the rows hold ``Σ_b len_b`` tokens; attention, quadratic in
``T``, makes the padding dearer still. :func:`length_groups` sorts the rows by length and cuts them
into at most ``K`` contiguous groups with the fewest padded positions; :func:`grouped` runs one
forward per group, each cut to its own longest row, and puts the per-row outputs back in the batch's
order. Each row's outputs are those of the one-pass forward up to float rounding: a row attends to
its own tokens only (causal attention over flush-left rows), whichever rows share its pass.
With gradients on, the groups' graphs join in the reassembled output, so one backward pass covers
them all and the loss is computed over the whole batch, as in one pass.

For a fixed number of groups the best partition is contiguous in the sorted order (exchanging a
longer row of an earlier group with a shorter row of a later one never adds padding), so a dynamic
programme over the sorted lengths finds it exactly: ``f_k(j) = min_i f_{k-1}(i) + (j − i)·s_j``,
with ``s`` the sorted lengths (1-based) and ``f_k(j)`` the least padded area of the ``j`` shortest
rows in at most ``k`` groups.

Each pass has a fixed cost (Python, kernel launches, a ZeRO-3 gather), counted as ``call_tokens``
positions, so a batch is split only where that much padding goes (``--length_group_call_tokens``).
Measured in the PPO stage on CPU (tiny Gemma, 1 thread, ``benchmarks/profile_ppo.py --ab``),
CPU seconds per step one pass → groups (at most 4, call cost 64): at 64-token answers score
0.099 → 0.092, train 0.216 → 0.202; at 256, score 0.232 → 0.210, train 0.524 → 0.463; at 16 no
change (with call cost 0 the 16-token step was 20 % slower: one-row passes).

>>> groups = length_groups(torch.tensor([5, 30, 6, 29, 7]), max_groups=2)
>>> [g.tolist() for g in groups]
[[0, 2, 4], [3, 1]]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from marlhf.runtime.grouping import Grouping


def length_groups(
    lengths: torch.Tensor,
    max_groups: int,
    call_tokens: float = 0.0,
    packed_attention: float | None = None,
) -> list[torch.Tensor]:
    """The rows, shortest first, cut into at most ``max_groups`` groups at the least cost.

    lengths: (B,) long, each row's length. Returns a list of (n_g,) long row indices, the groups in
    increasing length, their union ``0 … B−1``, whose cost ``Σ_g n_g · max_{b∈g} lengths[b] +
    call_tokens · (number of groups)`` (the padded area, plus each pass's fixed overhead counted in
    positions) is the least over all partitions into at most ``max_groups`` groups; among equal
    costs the fewest groups are taken (equal lengths stay in one group).

    ``packed_attention``: the groups are packed (:mod:`marlhf.models.packing`) and a group costs
    :func:`packed_cost` with that attention weight instead of its padded area; the least cost is
    then taken over the partitions contiguous in length order. Where none of those groups would
    put two rows in one bin, packing changes nothing and the padded groups are taken."""
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    if call_tokens < 0:
        raise ValueError(f"call_tokens must be >= 0, got {call_tokens}")
    B = lengths.shape[0]
    order = torch.sort(lengths.cpu(), stable=True).indices
    if B <= 1 or max_groups == 1:
        return [order.to(lengths.device)]
    s = lengths.cpu()[order].to(torch.float64)  # (B,) sorted
    i = torch.arange(B + 1, dtype=torch.float64)
    if packed_attention is None:
        # cost[i, j]: rows i..j-1 (sorted, 0-based) as one group = (j − i) · s[j−1]
        cost = (i[None, :] - i[:, None]) * torch.cat([s.new_zeros(1), s])[None, :]
    else:
        cost, shared = packed_cost(s, packed_attention, with_shared=True)
    cost = cost.masked_fill(i[:, None] >= i[None, :], float("inf"))  # inf unless i < j
    best = cost[0].clone()  # best[j]: the j shortest rows in one group
    best[0] = 0.0
    cuts = []  # cuts[k][j]: where the last group of the best ≤(k+2)-group split of j rows starts
    for _ in range(max_groups - 1):
        split, start = (best[:, None] + cost).min(0)  # (B+1,) the best with one more group
        split = split + call_tokens
        better = split < best  # strictly: among equal areas keep fewer groups
        cuts.append(torch.where(better, start, -1))
        best = torch.where(better, split, best)
    bounds, j = [], B
    for k in range(len(cuts) - 1, -1, -1):
        i0 = int(cuts[k][j])
        if i0 >= 0:
            bounds.append((i0, j))
            j = i0
    bounds.append((0, j))
    if packed_attention is not None and not any(shared[a, b] for a, b in bounds):
        return length_groups(lengths, max_groups, call_tokens)
    return [order[a:b].to(lengths.device) for a, b in reversed(bounds)]


def packed_cost(s: torch.Tensor, attention: float, with_shared: bool = False):
    """The cost of each contiguous run of rows packed into bins of its longest row's width:
    ``cost[i, j]`` for sorted rows ``i … j−1`` ((B+1, B+1) float64; meaningful where i < j).

    s: (B,) float64 lengths in increasing order. A run of n rows, S tokens, longest C fills
    ``K = max(⌈S / C⌉, rows longer than C/2)`` bins (a bound first-fit meets closely). Each bin
    costs its C positions, and its attention ``attention × C`` more per position: a bin of several
    rows attends under a block mask (every pair of its positions computed), while bins of one row
    each are the padded rows themselves, attended causally (half the pairs):
    ``K·C·(1 + attention·C)`` if K < n, else ``n·C·(1 + attention·C/2)``.
    ``attention``: a model's attention cost per position of context over its other cost per
    token (:func:`marlhf.models.packing.attention_weight`). ``with_shared``: also whether each run
    puts two rows in one bin (K < n), (B+1, B+1) bool."""
    B = s.shape[0]
    zero = s.new_zeros(1)
    prefix = torch.cat([zero, s.cumsum(0)])  # (B+1,)
    C = torch.cat([s[:1], s])[None, :]  # (1, B+1) the longest of rows ..j-1
    i = torch.arange(B + 1, dtype=torch.float64)[:, None]
    j = torch.arange(B + 1, dtype=torch.float64)[None, :]
    n = j - i
    S = prefix[None, :] - prefix[:, None]
    # rows longer than C/2 are a suffix of i..j-1: from the first sorted row above C/2
    first_big = torch.searchsorted(s, C[0] / 2, right=True).to(torch.float64)[None, :]
    big = (j - torch.maximum(i, first_big)).clamp(min=0)
    K = torch.maximum(torch.ceil(S / C.clamp(min=1)), big)
    cost = torch.where(K < n, K * C * (1 + attention * C), n * C * (1 + attention * C / 2))
    return (cost, K < n) if with_shared else cost


def grouped(
    forward: Callable[[torch.Tensor], torch.Tensor | tuple],
    lengths: torch.Tensor,
    widths: tuple[int, ...] | int,
    grouping: Grouping,
    packed_attention: float | None = None,
):
    """Run ``forward(rows)`` once per :func:`length_groups` group (``grouping``) and reassemble
    its outputs.

    ``forward(rows)`` takes (n,) long row indices and returns a tensor, or a tuple of tensors (or
    None), each (n, W', ...) with W' ≤ the matching entry of ``widths`` (the full batch's width of
    that output, e.g. A for per-action outputs, T for per-position ones). Returns the same structure
    with (B, W, ...) tensors in the batch's row order, right-padded with 0 beyond each group's width
    (positions past a row's own tokens, which callers mask). With one group it is
    ``forward(all rows)`` itself. ``packed_attention``: ``forward`` packs each group's rows
    (:func:`length_groups`)."""
    groups = length_groups(lengths, grouping.max_groups, grouping.call_tokens, packed_attention)
    if len(groups) == 1:
        return forward(torch.arange(lengths.shape[0], device=lengths.device))
    return run_groups(forward, groups, widths)


def run_groups(
    forward: Callable[[torch.Tensor], torch.Tensor | tuple],
    groups: list[torch.Tensor],
    widths: tuple[int, ...] | int,
):
    """``forward(rows)`` once per group of ``groups`` (their union ``0 … B−1``), its outputs
    reassembled in the batch's row order as :func:`grouped` describes."""
    outs = [forward(g) for g in groups]
    single = not isinstance(outs[0], tuple)
    parts = [(o,) if single else o for o in outs]
    widths = (widths,) if isinstance(widths, int) else tuple(widths)
    inverse = torch.argsort(torch.cat(groups))  # row b's place in the concatenation
    joined = []
    for k, W in enumerate(widths):
        if parts[0][k] is None:
            joined.append(None)
            continue
        padded = []
        for p in parts:
            x = p[k]
            pad = [0, 0] * (x.dim() - 2) + [0, W - x.shape[1]]
            padded.append(torch.nn.functional.pad(x, pad) if W > x.shape[1] else x)
        joined.append(torch.cat(padded)[inverse.to(padded[0].device)])
    return joined[0] if single else tuple(joined)
