"""Groups: the ``--n_samples_per_prompt G`` responses to one prompt (GRPO, Dr. GRPO, RLOO, the
leave-one-out prompt value of ``macro_mc``).

A step's global rollout has R = rollout size x ranks rows (`marlhf.runtime.rows.global_rows`
numbers them); it holds R / G distinct prompts, and global row i answers the step's prompt i // G. So a group
is G consecutive global rows, which may lie in different generation batches and on different ranks;
the estimate runs on the gathered global batch, where row i is global row i again, so the group of
row i is i // G there: the group statistics are those of one process with the whole batch.

The static decoder seeds each row's sampling noise from (seed, step, global row), so the G samples of
a prompt differ and do not depend on the split over ranks.
"""

from __future__ import annotations

import torch


def group_ids(n_rows: int, samples_per_prompt: int, device=None) -> torch.Tensor:
    """(n_rows,) long: the group (the step's prompt) of each row of the gathered global batch."""
    return torch.arange(n_rows, device=device) // samples_per_prompt


def group_stats(outcome: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    """``group/score_std``: the mean over groups of the (Bessel) std of their rows' sequence rewards;
    ``group/zero_std_frac``: the share of groups whose rows all scored the same (no signal for the
    group estimators)."""
    _, inverse, counts = torch.unique(
        ids.to(outcome.device), return_inverse=True, return_counts=True
    )
    n = counts.numel()
    x = outcome.double()
    mean = x.new_zeros(n).index_add_(0, inverse, x) / counts
    sq = x.new_zeros(n).index_add_(0, inverse, (x - mean[inverse]).square())
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    return {
        "group/score_std": float(std.mean()),
        "group/zero_std_frac": float((std < 1e-12).double().mean()),
    }
