"""Macro-action advantages (MA-RLHF Sec. 3.2): GAE over macro actions, broadcast back to tokens.

For macro action w_k with token weights sigma_{k,t} (``--value_function``):

    V_k = sum_{t in w_k} sigma_{k,t} v_t
    R_k = sum_{t in w_k} r_t                 (``--macro_reward_agg sum``, the default)
        = sum_{t in w_k} sigma_{k,t} r_t     (``weighted``, the original: with equal weights the
                                              per-token KL penalty is divided by about n)
    A_k, G_k = GAE over k with V_{K} = 0      (marlhf.rl.gae.gae)

and every token of w_k gets A_k and G_k. With one-token macro actions this is token-level GAE exactly.

Example (hand-worked in tests/macro/test_estimate.py): 4 tokens, macro actions {0,1} and {2,3}.

>>> import torch
>>> from marlhf.macro.segments import build_segments
>>> seg = build_segments(torch.tensor([[0, 1, 0, 1]]).bool(), torch.ones(1, 4).bool())
>>> adv, ret = macro_advantages(
...     torch.tensor([[0.0, -0.5, 0.0, 1.0]]), torch.tensor([[1.0, 3.0, 2.0, 2.0]]),
...     torch.ones(1, 4).bool(), seg, value_function="equal", reward_agg="sum", gamma=1.0, lam=1.0)
>>> adv.tolist(), ret.tolist()
([[-1.5, -1.5, -1.0, -1.0]], [[0.5, 0.5, 1.0, 1.0]])
"""

from __future__ import annotations

import torch

from marlhf.macro.segments import MacroSegments, macro_weights, to_macro, to_tokens
from marlhf.rl.gae import gae

__all__ = ["macro_advantages", "macro_stats"]


def macro_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    segments: MacroSegments,
    *,
    value_function: str = "equal",
    reward_agg: str = "sum",
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token advantages and returns from GAE over macro actions.

    Args:
        rewards: (B, A) float — per-token rewards (KL terms plus the score on the last token).
        values: (B, A) float — critic values per token.
        action_mask: (B, A) bool — response tokens (must agree with `segments`).
        segments: macro layout from `build_segments`.
        value_function: sigma weights: ``equal`` | ``position`` | ``unit``.
        reward_agg: ``sum`` | ``weighted`` (see module docstring).
        gamma, lam: GAE discount and lambda over macro steps.

    Returns:
        advantages (B, A), returns (B, A): each token carries its macro action's A_k and G_k; 0 on padding.
    """
    if reward_agg not in ("sum", "weighted"):
        raise ValueError(
            f"--macro_reward_agg must be one of ('sum', 'weighted'), got {reward_agg!r}"
        )
    if action_mask.shape != segments.ids.shape:
        raise ValueError(
            f"action_mask {tuple(action_mask.shape)} does not match segments {tuple(segments.ids.shape)}"
        )
    if not torch.equal(action_mask.bool(), segments.ids >= 0):
        raise ValueError("action_mask does not agree with the segments' tokens (ids >= 0)")
    weights = macro_weights(segments, value_function, dtype=values.dtype)
    macro_values = to_macro(values, segments, weights)  # (B, M)
    macro_rewards = to_macro(rewards, segments, weights if reward_agg == "weighted" else None)
    adv, ret = gae(macro_rewards, macro_values, segments.mask, gamma, lam)  # (B, M)
    return to_tokens(adv, segments), to_tokens(ret, segments)


def macro_stats(segments: MacroSegments, fallback: torch.Tensor | None = None) -> dict[str, float]:
    """Segmentation diagnostics for logging.

    Keys: ``macro/count`` mean macro actions per response; ``macro/mean_len`` pooled mean tokens per
    macro action (all tokens / all macro actions); ``macro/max_len`` longest macro action;
    ``macro/fallbacks`` number of rows in the batch where the rule fell back to ``fixed``.
    """
    count = segments.count.to(torch.float64)
    total = float(count.sum())
    tokens = float(segments.lengths.sum())
    return {
        "macro/count": float(count.mean()) if count.numel() else 0.0,
        "macro/mean_len": tokens / total if total > 0 else 0.0,
        "macro/max_len": float(segments.lengths.max()) if segments.lengths.numel() else 0.0,
        "macro/fallbacks": float(fallback.sum()) if fallback is not None else 0.0,
    }
