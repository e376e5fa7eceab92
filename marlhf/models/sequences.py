"""Prompt ⧺ response sequences as the models read them: packing, the response mask, and reading
per-response-token quantities.

Layout. Generation takes left-padded prompts ``(B, P)`` and returns responses ``(B, A)``, right-padded
after each row's first EOS. For scoring, every sequence is packed *flush left* — prompt tokens, then
response tokens, then padding — so all four models see ordinary right-padded batches with positions
0, 1, 2, … (as in SFT and RM training). Row ``b``'s response starts at ``response_start[b]`` (its
prompt length); the logit at position ``t`` predicts token ``t+1``, so response token ``j`` is scored by
the logit at ``response_start[b] − 1 + j``, and the critic's value of the state before token ``j`` is read
at the same position.
"""

from __future__ import annotations

import torch

from marlhf.models.logprobs import entropy_from_logits, token_logprobs


def response_mask(
    response_ids: torch.Tensor, eos_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid tokens up to and including each row's first EOS.

    response_ids: (B, A) long. Returns (action_mask (B, A) bool, ends_with_eos (B,) bool).

    >>> m, e = response_mask(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8]]), eos_ids=[2])
    >>> m.int().tolist(), e.tolist()
    ([[1, 1, 0, 0], [1, 1, 1, 1]], [True, False])
    """
    is_eos = torch.zeros_like(response_ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= response_ids == e
    # tokens strictly after the first EOS: cumulative count of EOS before them > 0
    seen_before = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0
    return ~seen_before, is_eos.any(dim=1)


def pack_flush_left(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    action_mask: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenate left-padded prompts and right-padded responses into flush-left sequences.

    prompt_ids, prompt_mask: (B, P); response_ids, action_mask: (B, A).
    Returns (sequences (B, T), attention_mask (B, T) bool, response_start (B,) long) with
    T = max over rows of prompt length + response length.

    >>> s, m, r = pack_flush_left(torch.tensor([[0, 7, 8], [6, 7, 8]]), torch.tensor([[0, 1, 1], [1, 1, 1]]),
    ...                           torch.tensor([[3, 0], [4, 5]]), torch.tensor([[1, 0], [1, 1]]), pad_id=0)
    >>> s.tolist(), r.tolist()
    ([[7, 8, 3, 0, 0], [6, 7, 8, 4, 5]], [2, 3])
    """
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    valid = torch.cat([prompt_mask.bool(), action_mask.bool()], dim=1)
    # stable sort puts valid tokens first, each row keeping its order
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    packed = torch.gather(ids, 1, order)
    mask = torch.gather(valid, 1, order)
    length = int(mask.sum(dim=1).max())
    packed, mask = packed[:, :length], mask[:, :length]
    packed = packed.masked_fill(~mask, pad_id)
    return packed, mask, prompt_mask.bool().sum(dim=1)


def action_offsets(
    response_start: torch.Tensor, num_actions: int, offsets: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, A) long: where each action sits in its row's response. ``offsets`` (B, A) long, when
    the actions do not fill the response (a multi-turn conversation: its observations lie between
    the actions, and action ``j`` of row ``b`` is response token ``offsets[b, j]``); None: action
    ``j`` is response token ``j``."""
    if offsets is not None:
        return offsets[:, :num_actions].to(response_start.device)
    j = torch.arange(num_actions, device=response_start.device)
    return j.expand(response_start.shape[0], num_actions)


def state_positions(
    response_start: torch.Tensor,
    num_actions: int,
    width: int,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, A) long: the position of the state before each action, ``response_start[b] − 1 +
    j`` (``+ offsets[b, j]`` with ``offsets``, :func:`action_offsets`), clamped into ``[0,
    width)`` (where :func:`gather_response` reads)."""
    j = action_offsets(response_start, num_actions, offsets)
    return (response_start.unsqueeze(1) - 1 + j).clamp(0, width - 1)


def gather_response(
    x: torch.Tensor,
    response_start: torch.Tensor,
    num_actions: int,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Read per-position quantities at the positions that predict/precede each action.

    x: (B, T) or (B, T, ...) indexed by position t, where position t looks at tokens ≤ t.
    Returns (B, A, ...) with element j = x[b, response_start[b] − 1 + j] (``+ offsets[b, j]``
    with ``offsets``: the actions of a conversation, :func:`action_offsets`; clamped inside the
    row; entries past a row's actions are meaningless and masked by the caller).
    """
    B, T = x.shape[:2]
    idx = state_positions(response_start.to(x.device), num_actions, T, offsets)  # (B, A)
    if x.dim() == 2:
        return torch.gather(x, 1, idx)
    extra = x.shape[2:]
    idx = idx.view(B, num_actions, *([1] * len(extra))).expand(B, num_actions, *extra)
    return torch.gather(x, 1, idx)


def end_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid position of each row: (B, T) bool -> (B,) long."""
    T = attention_mask.shape[1]
    pos = torch.arange(T, device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), pos, -1).amax(dim=1).clamp(min=0)


def response_logprobs_and_entropy(
    logits: torch.Tensor,
    sequences: torch.Tensor,
    response_start: torch.Tensor,
    num_actions: int,
    *,
    with_entropy: bool = False,
    offsets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(a_j | s_j) (and the entropy of π(· | s_j)) for every action (``offsets``: where the
    actions of a conversation sit in its response, :func:`action_offsets`).

    logits: (B, T, V) already divided by the sampling temperature; sequences: (B, T).
    Returns (logprobs (B, A), entropy (B, A) or None).
    """
    B, T, V = logits.shape
    j = action_offsets(response_start.to(logits.device), num_actions, offsets)
    pos = (response_start.to(logits.device).unsqueeze(1) - 1 + j).clamp(0, T - 2)  # (B, A)
    sel = torch.gather(logits, 1, pos.unsqueeze(-1).expand(B, num_actions, V))  # (B, A, V)
    labels = torch.gather(sequences, 1, pos + 1)  # (B, A)
    logp = token_logprobs(sel, labels)
    ent = entropy_from_logits(sel) if with_entropy else None
    return logp, ent
