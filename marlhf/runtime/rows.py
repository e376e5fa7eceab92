"""Where a row of a PPO step sits in the global batch across data-parallel ranks, which prompt it
answers, and the per-row seeds of the step's random draws.

A step's rollout is made of generation batches of ``batch`` rows; rank ``r``'s batch ``j`` is global
batch ``j·world + r`` (`marlhf.runtime.batching.step_micro_batches`), so the global row of every local
row is a pure function of (its index, the batch size, the rank, the world size): :func:`global_rows`.
Per-row randomness (the ``randomized`` termination rule, dense rewards, the static decoder's
sampling noise, Monte-Carlo continuations) is drawn from seeds hashed from (seed, step, stream, the
global row): :func:`derive_row_seeds`. Together they make a step's samples independent of the split
over ranks, and a resumed run redraws them without a saved generator state.

>>> import numpy as np
>>> perm = np.arange(100, 116)  # the epoch's prompt order
>>> # 8 rows per step (2 ranks x 2 batches x 2 rows), G = 4: step 0 takes prompts 100 and 101
>>> step_prompt_indices(perm, 0, batch=2, batches=2, world=2, rank=0, samples_per_prompt=4)
[[100, 100], [101, 101]]
>>> step_prompt_indices(perm, 0, batch=2, batches=2, world=2, rank=1, samples_per_prompt=4)
[[100, 100], [101, 101]]
"""

from __future__ import annotations

import numpy as np
import torch


def global_rows(n_rows: int, block: int, rank: int, world: int) -> torch.Tensor:
    """(n_rows,) long index in the global batch of each of ``rank``'s rows: they are generation
    batches of ``block`` rows, and rank ``r``'s batch ``j`` is global batch ``j·world + r``
    (`marlhf.runtime.batching.step_micro_batches`); ``gather_experience`` puts the rows in this order.

    >>> global_rows(4, 2, rank=1, world=2).tolist()
    [2, 3, 6, 7]
    """
    local = torch.arange(n_rows)
    return (local // block * world + rank) * block + local % block


def step_prompt_indices(
    perm: np.ndarray,
    step: int,
    *,
    batch: int,
    batches: int,
    world: int,
    rank: int,
    samples_per_prompt: int,
) -> list[list[int]]:
    """``rank``'s generation batches of step ``step`` (of its epoch): ``batches`` lists of ``batch``
    prompt indices. Global row i of the step answers prompt ``perm[step · R/G + i // G]`` (R = batch ×
    batches × world rows, G = ``samples_per_prompt``); with G = 1 these are the batches of
    `marlhf.runtime.batching.step_micro_batches`."""
    G = samples_per_prompt
    R = batch * batches * world
    if R % G:
        raise ValueError(f"{R} rows per step are not a multiple of --n_samples_per_prompt {G}")
    rows = global_rows(batch * batches, batch, rank, world).numpy()
    idx = perm[step * (R // G) + rows // G]
    return [[int(i) for i in idx[j * batch : (j + 1) * batch]] for j in range(batches)]


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele et al. 2014): a 64-bit integer hash."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def derive_row_seeds(seed: int, step: int, rows: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """(B,) long seeds in [0, 2^32) for `TerminationInputs.row_seeds`: a hash of (``seed``, ``step``,
    ``stream``, each row's index ``rows: (B,) long`` in the global batch), so a row's ``randomized``
    draw is the same whatever the batch is split into, and a resumed run redraws it from the step
    alone. ``stream`` separates independent draws for the same rows. (torch's CPU generator keeps 32
    bits of its seed.)

    >>> seeds = derive_row_seeds(1234, 0, torch.tensor([0, 5]))  # rows 0 and 5 of step 0
    >>> int(seeds[1]) == int(derive_row_seeds(1234, 0, torch.tensor([5])))  # row 5 alone
    True
    """
    base = _splitmix64(_splitmix64(seed & _MASK64) ^ (step & _MASK64))
    base = _splitmix64(base ^ (stream & _MASK64))
    return torch.tensor(
        [_splitmix64(base ^ (r & _MASK64)) >> 32 for r in rows.tolist()], dtype=torch.long
    )


def turn_seeds(row_seeds: torch.Tensor, turn: int) -> torch.Tensor:
    """(B,) long seeds in [0, 2^32) of turn ``turn`` (1, 2, ...) of multi-turn episodes whose rows
    have the seeds ``row_seeds`` (B,) long (:func:`derive_row_seeds`): a hash of each row's seed
    and the turn, so a row's episode is the same whatever batch it plays in, and a resumed run
    replays it.

    >>> s = derive_row_seeds(1234, 0, torch.tensor([0, 5]), stream=2)
    >>> int(turn_seeds(s, 2)[1]) == int(turn_seeds(s[1:], 2)[0]) != int(turn_seeds(s, 3)[1])
    True
    """
    base = _splitmix64(turn & _MASK64)
    return torch.tensor(
        [_splitmix64(_splitmix64(s & _MASK64) ^ base) >> 32 for s in row_seeds.tolist()],
        dtype=torch.long,
    )
