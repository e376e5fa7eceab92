"""Macro-action segments: which macro action each response token belongs to, and moving values
between the token level `(B, A)` and the macro level `(B, M)`.

A termination rule marks `macro_end: (B, A) bool`, true on the last token of every macro action.
`build_segments` turns that into indices; `to_macro` sums (optionally weighted) token quantities per
macro action; `to_tokens` broadcasts a macro quantity back to its tokens. All vectorised with
scatter_add / gather (MA-RLHF Sec. 3.2: V(s_k) = sum_t sigma_{k,t} v_t).

Example: two rows, the second has 3 valid tokens.

>>> import torch
>>> macro_end = torch.tensor([[0, 1, 0, 1, 1], [1, 0, 1, 0, 0]], dtype=torch.bool)
>>> action_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
>>> seg = build_segments(macro_end, action_mask)
>>> seg.ids.tolist()
[[0, 0, 1, 1, 2], [0, 1, 1, -1, -1]]
>>> seg.count.tolist(), seg.lengths.tolist(), seg.start.tolist(), seg.end.tolist()
([3, 2], [[2, 2, 1], [1, 2, 0]], [[0, 2, 4], [0, 1, 0]], [[1, 3, 4], [0, 2, 0]])
>>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 9.0, 9.0]])
>>> to_macro(x, seg).tolist()
[[3.0, 7.0, 5.0], [1.0, 5.0, 0.0]]
>>> to_tokens(to_macro(x, seg), seg).tolist()
[[3.0, 3.0, 7.0, 7.0, 5.0], [1.0, 5.0, 5.0, 0.0, 0.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MacroSegments", "build_segments", "macro_weights", "to_macro", "to_tokens"]


@dataclass
class MacroSegments:
    """Macro-action layout of a right-padded batch of responses.

    Fields:
        ids: (B, A) long — index (0..count_b-1) of the macro action each token belongs to, -1 on padding.
        count: (B,) long — number of macro actions per response (0 for an empty response).
        mask: (B, M) bool — valid macro actions (a prefix of each row); M = max count, at least 1.
        lengths: (B, M) long — tokens per macro action, 0 where invalid.
        start: (B, M) long — token index of each macro action's first token, 0 where invalid.
        end: (B, M) long — token index of each macro action's last token, 0 where invalid.
    """

    ids: torch.Tensor
    count: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor

    @property
    def action_mask(self) -> torch.Tensor:
        """(B, A) bool — the response tokens (ids >= 0)."""
        return self.ids >= 0

    @property
    def macro_end(self) -> torch.Tensor:
        """(B, A) bool — true on the last token of every macro action."""
        positions = torch.arange(self.ids.shape[1], device=self.ids.device)
        return (self.ids >= 0) & (positions == self.end.gather(1, self.ids.clamp(min=0)))


def build_segments(macro_end: torch.Tensor, action_mask: torch.Tensor) -> MacroSegments:
    """Index macro actions from their end markers.

    Args:
        macro_end: (B, A) bool — true on the last token of each macro action; must be true on the last
            valid token of each non-empty row and false on padding.
        action_mask: (B, A) bool — response tokens, true on a prefix of each row.

    A zero-width batch (A = 0) gives empty segments: count 0 and one invalid macro column.

    Raises:
        ValueError: if shapes differ, `action_mask` is not a prefix mask, `macro_end` is set on padding,
            or the last valid token of a row is not a macro end.
    """
    if macro_end.shape != action_mask.shape or macro_end.dim() != 2:
        raise ValueError(
            f"macro_end {tuple(macro_end.shape)} and action_mask {tuple(action_mask.shape)} must "
            "both be (B, A)"
        )
    macro_end = macro_end.bool()
    action_mask = action_mask.bool()
    B, A = action_mask.shape
    device = action_mask.device
    if A > 1 and bool((action_mask[:, 1:] & ~action_mask[:, :-1]).any()):
        raise ValueError("action_mask must be right-padded (true on a prefix of each row)")
    if bool((macro_end & ~action_mask).any()):
        rows = torch.nonzero((macro_end & ~action_mask).any(1)).flatten().tolist()
        raise ValueError(f"macro_end is true on padding in rows {rows[:10]}")
    n_valid = action_mask.sum(1)  # (B,)
    last = (n_valid - 1).clamp(min=0)
    # A zero-width batch (A = 0) has no last token to check: every row is empty.
    last_is_end = macro_end.gather(1, last[:, None]).squeeze(1) if A > 0 else n_valid == 0
    bad = (n_valid > 0) & ~last_is_end
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise ValueError(
            f"macro_end must be true on the last valid token; not so in rows {rows[:10]}"
        )

    ends = macro_end.long()
    # A token belongs to the macro action numbered by the ends strictly before it.
    ids = torch.cumsum(ends, dim=1) - ends
    ids = torch.where(action_mask, ids, torch.full_like(ids, -1))
    count = ends.sum(1)
    M = max(int(count.max()) if B > 0 else 0, 1)
    safe_ids = ids.clamp(min=0)
    lengths = torch.zeros(B, M, dtype=torch.long, device=device)
    lengths.scatter_add_(1, safe_ids, action_mask.long())
    positions = torch.arange(A, device=device).expand(B, A)
    end = torch.zeros(B, M, dtype=torch.long, device=device)
    end.scatter_add_(1, safe_ids, positions * ends)  # exactly one end per macro action
    mask = torch.arange(M, device=device)[None, :] < count[:, None]
    start = torch.where(mask, end - lengths + 1, torch.zeros_like(end))
    return MacroSegments(ids=ids, count=count, mask=mask, lengths=lengths, start=start, end=end)


def macro_weights(
    segments: MacroSegments, value_function: str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Token weights sigma_{k,t} inside each macro action (MA-RLHF Sec. 3.2), (B, A) float of `dtype`
    (default: torch's default dtype).

    - ``equal``: 1/|w_k| for every token of macro action k.
    - ``position``: proportional to 1/(j+1), j the token's position inside its macro action,
      normalised to sum to 1 per macro action.
    - ``unit``: 1 on the last token of each macro action, 0 elsewhere.
    - ``start``: 1 on the first token of each macro action, 0 elsewhere. The value at token j's
      position is V(s_j), the state *before* token j, so this is V at the state where the macro action
      begins: a baseline that does not depend on the macro action it judges (the others read states
      after some of its own tokens, which biases the policy gradient).

    Weights are 0 on padding and sum to 1 over each macro action.

    >>> import torch
    >>> seg = build_segments(torch.tensor([[0, 1, 0, 0, 1]]).bool(), torch.ones(1, 5).bool())
    >>> macro_weights(seg, "unit").tolist()
    [[0.0, 1.0, 0.0, 0.0, 1.0]]
    >>> [round(w, 4) for w in macro_weights(seg, "position")[0].tolist()]
    [0.6667, 0.3333, 0.5455, 0.2727, 0.1818]
    >>> macro_weights(seg, "start").tolist()
    [[1.0, 0.0, 1.0, 0.0, 0.0]]
    """
    valid = segments.ids >= 0
    safe_ids = segments.ids.clamp(min=0)
    dtype = dtype or torch.get_default_dtype()
    lengths = segments.lengths.gather(1, safe_ids).to(dtype)  # (B, A)
    if value_function == "equal":
        w = 1.0 / lengths.clamp(min=1)
    elif value_function == "position":
        positions = torch.arange(segments.ids.shape[1], device=segments.ids.device)
        j = (positions[None, :] - segments.start.gather(1, safe_ids)).clamp(min=0)
        raw = torch.where(valid, 1.0 / (j + 1).to(lengths.dtype), torch.zeros_like(lengths))
        norm = torch.zeros(segments.lengths.shape, dtype=raw.dtype, device=raw.device)
        norm.scatter_add_(1, safe_ids, raw)
        w = raw / norm.gather(1, safe_ids).clamp(min=torch.finfo(raw.dtype).tiny)
    elif value_function == "unit":
        w = segments.macro_end.to(lengths.dtype)
    elif value_function == "start":
        positions = torch.arange(segments.ids.shape[1], device=segments.ids.device)
        w = (positions[None, :] == segments.start.gather(1, safe_ids)).to(lengths.dtype)
    else:
        raise ValueError(
            "--value_function must be one of ('equal', 'position', 'unit', 'start'), got "
            f"{value_function!r}"
        )
    return torch.where(valid, w, torch.zeros_like(w))


def to_macro(
    x: torch.Tensor, segments: MacroSegments, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum token quantities per macro action: y_k = sum_{t in w_k} sigma_t x_t.

    Args:
        x: (B, A) float — token quantity (values, rewards); padding is ignored (may hold anything finite
            or not).
        segments: the batch's macro layout.
        weights: (B, A) float sigma, or None for a plain sum.

    Returns:
        (B, M) float, 0 on invalid macro actions.
    """
    valid = segments.ids >= 0
    src = x if weights is None else x * weights
    src = torch.where(valid, src, torch.zeros_like(src))
    out = torch.zeros(segments.lengths.shape, dtype=src.dtype, device=src.device)
    return out.scatter_add_(1, segments.ids.clamp(min=0), src)


def to_tokens(y: torch.Tensor, segments: MacroSegments) -> torch.Tensor:
    """Broadcast a macro quantity to its tokens: x_t = y_{k(t)}.

    Args:
        y: (B, M) — one value per macro action.

    Returns:
        (B, A), 0 on padding.
    """
    out = y.gather(1, segments.ids.clamp(min=0))
    return torch.where(segments.ids >= 0, out, torch.zeros_like(out))
