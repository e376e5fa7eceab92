"""Generalised advantage estimation (Schulman et al., 2016) — the one GAE of the project.

The same function serves token steps (token PPO) and macro-action steps (MA-PPO): a "step" is
whatever the columns of `rewards` / `values` are. Valid steps are a prefix of each row; the value after
the last valid step is 0 (the episode ends with the response).

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}
    R_t     = A_t + V_t                      (the critic's target)

>>> import torch
>>> r = torch.tensor([[0.0, 0.0, 1.0]])
>>> v = torch.tensor([[0.5, 0.5, 0.5]])
>>> adv, ret = gae(r, v, torch.ones(1, 3, dtype=torch.bool), gamma=1.0, lam=1.0)
>>> adv.tolist(), ret.tolist()
([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]])
"""

from __future__ import annotations

import torch

__all__ = ["gae", "whiten"]


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns over steps S (tokens or macro actions), vectorised over the batch.

    Args:
        rewards: (B, S) float — reward of each step.
        values: (B, S) float — critic value of each step's state.
        mask: (B, S) bool — valid steps, true on a prefix of each row.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        advantages (B, S), returns (B, S) = advantages + values; both 0 on invalid steps.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must all be (B, S)"
        )
    mask = mask.bool()
    # float32 at least: a bf16 critic's values would round each reversed-sum step to 8 bits
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    values, rewards = values.to(dtype), rewards.to(dtype)
    zeros = torch.zeros_like(values)
    values = torch.where(mask, values, zeros)  # padding may hold garbage; V beyond the end is 0
    rewards = torch.where(mask, rewards, zeros)
    S = rewards.shape[1]
    advantages = torch.zeros_like(values)
    last_adv = torch.zeros_like(values[:, 0])
    next_value = torch.zeros_like(values[:, 0])
    for t in reversed(range(S)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last_adv = delta + gamma * lam * last_adv
        # Invalid steps lie after the valid prefix: reset so the last valid step sees A_{T} = 0.
        last_adv = torch.where(mask[:, t], last_adv, torch.zeros_like(last_adv))
        advantages[:, t] = last_adv
        next_value = values[:, t]
    returns = torch.where(mask, advantages + values, zeros)
    return advantages, returns


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise `x` to unit variance (and zero mean if `shift_mean`) over the masked entries.

    Uses the unbiased variance over the valid entries (population variance if only one).

    Args:
        x: (B, S) float.
        mask: (B, S) bool — entries that count.

    Returns:
        (B, S) float, 0 where `mask` is false.

    >>> import torch
    >>> whiten(torch.tensor([[1.0, 3.0, 99.0]]), torch.tensor([[True, True, False]])).tolist()
    [[-0.7071067690849304, 0.7071067690849304, 0.0]]
    """
    mask = mask.bool()
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # the statistics in float32 at least
    xm = torch.where(mask, x, torch.zeros_like(x))
    n = mask.sum()
    n_f = n.to(x.dtype).clamp(min=1)
    mean = xm.sum() / n_f
    centered = torch.where(mask, x - mean, torch.zeros_like(x))
    var = (centered**2).sum() / (n_f - 1).clamp(min=1)
    out = centered * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros_like(out))
