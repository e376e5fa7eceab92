"""The phase split: one dataset divided between SFT (phase 1), reward model (2) and PPO (3).

As in DeepSpeed-Chat: the weights of ``data_split`` ("2,4,4") are normalised, their cumulative sums
times ``n`` are rounded to chunk boundaries, the rows are permuted with
``np.random.RandomState(seed)`` and phase ``p`` takes chunk ``p - 1``. The parts are disjoint, cover
all rows and depend only on ``(n, data_split, seed)``, so every stage sees the same split as long
as the stages share the seed: ``--data_seed`` when set (``DataConfig.split_seed``), else each
stage's ``--seed``. The train and eval splits of a dataset are divided separately.

>>> sorted(phase_indices(10, "2,4,4", 1, seed=1234).tolist() + phase_indices(10, "2,4,4", 2, seed=1234).tolist()
...        + phase_indices(10, "2,4,4", 3, seed=1234).tolist()) == list(range(10))
True
>>> len(phase_indices(10, "2,0,8", 2, seed=0))
0
"""

from __future__ import annotations

import numpy as np


def split_bounds(n: int, data_split: str) -> list[int]:
    """Chunk boundaries ``[0, b1, b2, n]`` for ``n`` rows (cumulative rounding of the weights)."""
    weights = [float(w) for w in data_split.split(",")]
    if len(weights) != 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"--data_split needs three non-negative weights, got {data_split!r}")
    total = sum(weights)
    cum = np.cumsum([w / total for w in weights])
    bounds = [0] + [int(round(c * n)) for c in cum]
    bounds[-1] = n  # guard against float error in the last cumulative sum
    return bounds


def phase_indices(n: int, data_split: str, phase: int, seed: int) -> np.ndarray:
    """Row indices (int64, permuted order) of ``phase`` (1, 2 or 3) among ``n`` rows."""
    if phase not in (1, 2, 3):
        raise ValueError(f"phase must be 1, 2 or 3, got {phase}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    bounds = split_bounds(n, data_split)
    perm = np.random.RandomState(seed).permutation(n).astype(np.int64)
    return perm[bounds[phase - 1] : bounds[phase]]
