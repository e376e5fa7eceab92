"""Macro-action advantages (MA-RLHF Sec. 3.2): GAE over macro actions, broadcast back to tokens.

For macro action w_k with token weights sigma_{k,t} (``--value_function``):

    V_k = sum_{t in w_k} sigma_{k,t} v_t
    R_k = sum_{t in w_k} r_t                 (``--macro_reward_agg sum``, the default)
        = sum_{t in w_k} sigma_{k,t} r_t     (``weighted``, the original: with equal weights the
                                              per-token KL penalty is divided by about n)
          [+ score on the last macro action]
    A_k, G_k = GAE over k with V_{K} = 0      (marlhf.algo.gae.gae)

and every token of w_k gets A_k and G_k. With one-token macro actions this is token-level GAE exactly.
``--value_function start`` (sigma = 1 on the first token) makes V_k the critic's V at the state where
w_k begins, the semi-MDP value: the only weighting whose baseline does not depend on w_k's own tokens.

The sequence score. ``weighted`` is meant for the per-token KL rewards; the reward model's score is one
number for the whole response and should enter its macro action whole. With ``--eos_own_macro`` a row
that ends with EOS has the EOS token as a 1-token last macro action, so its score is whole anyway, but a
truncated row's last macro action is an ordinary chunk and weighting would average the score into it.
Passing ``scores`` apart from the per-token ``rewards`` keeps it whole: it is added
to the last macro action's reward after the weighting. With ``sum`` the result is bit-identical to
passing the rewards with the score already on the last token (`marlhf.algo.kl_rewards.compose_rewards`).

Example (hand-worked in tests/algo/test_macro_gae.py): 4 tokens, macro actions {0,1} and {2,3}.

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

from marlhf.algo.gae import gae
from marlhf.macro.segments import MacroSegments, macro_weights, to_macro, to_tokens

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
    scores: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token advantages and returns from GAE over macro actions.

    Args:
        rewards: (B, A) float — per-token rewards: KL terms plus the score on the last token, or,
            when `scores` is given, the KL (and dense) terms only.
        values: (B, A) float — critic values per token (the value at token j is V(s_j), the state
            before token j).
        action_mask: (B, A) bool — response tokens (must agree with `segments`).
        segments: macro layout from `build_segments`.
        value_function: sigma weights: ``equal`` | ``position`` | ``unit`` | ``start``.
        reward_agg: ``sum`` | ``weighted`` (see module docstring).
        gamma, lam: GAE discount and lambda over macro steps.
        scores: (B,) float | None — each response's sequence-level reward (the clipped score plus any
            no-EOS penalty, `marlhf.algo.kl_rewards.sequence_rewards`), kept whole in the last macro action
            whatever `reward_agg`; ignored for empty rows. None: `rewards` already holds it.

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
    if scores is None:
        macro_rewards = to_macro(rewards, segments, weights if reward_agg == "weighted" else None)
    elif reward_agg == "sum":
        # the score on the last valid token, then the plain sum: the arithmetic of compose_rewards
        rewards = _add_to_last(rewards, scores, segments.end, segments)
        macro_rewards = to_macro(rewards, segments)
    else:
        # weight the per-token rewards only; the score enters the last macro action whole
        macro_rewards = to_macro(rewards, segments, weights)
        macro_rewards = _add_to_last(macro_rewards, scores, None, segments)
    adv, ret = gae(macro_rewards, macro_values, segments.mask, gamma, lam)  # (B, M)
    return to_tokens(adv, segments), to_tokens(ret, segments)


def _add_to_last(
    x: torch.Tensor, scores: torch.Tensor, end: torch.Tensor | None, segments: MacroSegments
) -> torch.Tensor:
    """`x` with each non-empty row's score added at its last valid token (`end`: the segments'
    (B, M) end positions; x is (B, A)) or, with `end` None, at its last macro action (x is (B, M))."""
    B = segments.count.shape[0]
    if scores.shape != (B,):
        raise ValueError(f"scores must be (B,) = ({B},), got {tuple(scores.shape)}")
    if x.shape[1] == 0:  # a zero-width batch: every row is empty
        return x
    last_macro = (segments.count - 1).clamp(min=0)[:, None]  # (B, 1)
    index = last_macro if end is None else end.gather(1, last_macro)
    score = torch.where(segments.count > 0, scores.to(x.dtype), 0.0)
    return x.scatter_add(1, index, score[:, None])


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
