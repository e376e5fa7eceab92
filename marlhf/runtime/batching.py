"""Deterministic, resumable batching across data-parallel ranks.

For each epoch the dataset indices are permuted with ``seed + epoch``; optimizer step ``s`` consumes the
global slice ``perm[s·G : (s+1)·G]`` with ``G = micro · accumulation · world``. Inside that slice,
micro-batch ``j`` of rank ``r`` takes ``micro`` consecutive indices at offset ``(j · world + r) · micro``.
So a run with 2 processes sees exactly the same examples per optimizer step as 1 process with the same
global batch, and resuming at step ``s`` needs no replay: the position is ``(epoch, s)``.
The last incomplete global batch of an epoch is dropped.
"""

from __future__ import annotations

import numpy as np


def steps_per_epoch(n: int, micro: int, accumulation: int, world: int) -> int:
    return n // (micro * accumulation * world)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.RandomState(seed + epoch).permutation(n)


def step_micro_batches(
    perm: np.ndarray, step: int, micro: int, accumulation: int, world: int, rank: int
) -> list[list[int]]:
    """The ``accumulation`` micro-batches (lists of dataset indices) of ``rank`` for optimizer ``step``.

    >>> perm = np.arange(16)
    >>> step_micro_batches(perm, 0, micro=2, accumulation=2, world=2, rank=1)
    [[2, 3], [6, 7]]
    >>> step_micro_batches(perm, 1, micro=4, accumulation=2, world=1, rank=0)
    [[8, 9, 10, 11], [12, 13, 14, 15]]
    """
    g = micro * accumulation * world
    chunk = perm[step * g : (step + 1) * g]
    out = []
    for j in range(accumulation):
        off = (j * world + rank) * micro
        out.append([int(i) for i in chunk[off : off + micro]])
    return out


def eval_shard(n: int, batch: int, world: int, rank: int, max_batches: int = 0) -> list[list[int]]:
    """Evaluation batches of ``rank``: a strided shard of ``range(n)``, in order."""
    idx = list(range(rank, n, world))
    batches = [idx[i : i + batch] for i in range(0, len(idx), batch)]
    return batches[:max_batches] if max_batches > 0 else batches


def padded_eval_shard(
    n: int, batch: int, world: int, rank: int, max_batches: int = 0
) -> list[tuple[list[int], bool]]:
    """``eval_shard`` of ``rank`` as ``(indices, real)`` pairs, padded to the same length on all ranks.

    Under ZeRO-3 every forward pass gathers the partitioned parameters collectively, so every rank
    must run as many forward passes as rank 0 (whose strided shard is the longest). A rank with fewer
    batches repeats its first one (row 0 if it has none) with ``real`` false: run it, then discard
    its result.

    >>> padded_eval_shard(5, 2, world=2, rank=0)
    [([0, 2], True), ([4], True)]
    >>> padded_eval_shard(5, 2, world=2, rank=1)
    [([1, 3], True), ([1, 3], False)]
    """
    mine = eval_shard(n, batch, world, rank, max_batches)
    most = len(eval_shard(n, batch, world, 0, max_batches))
    filler = mine[0] if mine else [0]
    return [(b, True) for b in mine] + [(filler, False)] * (most - len(mine))
