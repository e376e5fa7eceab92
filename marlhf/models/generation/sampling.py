"""The sampling calls every program makes (PPO's rollouts, its evaluation and its Monte-Carlo
continuations, ``marlhf infer``): a backend's raw responses made into :class:`Sampled`, valid up to
and including each row's first EOS; :func:`sample_turns`, the next turn of multi-turn
conversations."""

from __future__ import annotations

import torch

from marlhf.models.generation.base import (
    Conversations,
    GenerationBackend,
    Sampled,
    SamplingConfig,
)
from marlhf.models.sequences import response_mask


def sample_responses(
    sampler: GenerationBackend,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    cfg: SamplingConfig,
    eos_ids: list[int],
    pad_id: int,
    row_seeds: torch.Tensor | None = None,
) -> Sampled:
    """One response per row of the left-padded prompts ``prompt_ids``, ``prompt_mask`` (B, P)
    by ``sampler``, as ``cfg`` says (``--max_answer_seq_len``, temperature, top-k, top-p), valid
    up to and including each row's first token of ``eos_ids`` (``pad_id`` after it). ``row_seeds``
    (B,) long: each row's seed, for a backend with ``seeds_rows`` (ignored otherwise; None: the
    global RNG). The tensors are on the prompts' device."""
    seeds = row_seeds if sampler.seeds_rows else None
    out = sampler.sample(prompt_ids, prompt_mask, cfg, eos_ids, pad_id, seeds)
    return _sampled(out, prompt_ids.shape[0], eos_ids, pad_id, prompt_ids.device)


def left_pad(token_ids: list[list[int]], pad_id: int, device=None):
    """(ids (B, P) long, mask (B, P) bool) of token lists, left-padded with ``pad_id`` to the
    longest.

    >>> ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    >>> ids.tolist(), mask.int().tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    device = torch.device("cpu") if device is None else device
    P = max((len(t) for t in token_ids), default=0)
    ids = torch.full((len(token_ids), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(token_ids), P, dtype=torch.bool)
    for b, t in enumerate(token_ids):
        if t:
            ids[b, P - len(t) :] = torch.tensor(t, dtype=torch.long)
            mask[b, P - len(t) :] = True
    return ids.to(device), mask.to(device)


def sample_turns(
    sampler: GenerationBackend,
    conversations: Conversations,
    cfg: SamplingConfig,
    eos_ids: list[int],
    pad_id: int,
    row_seeds: torch.Tensor | None = None,
    device=None,
) -> Sampled:
    """The next action of each of B multi-turn conversations (:class:`Conversations`: each the
    whole conversation so far as token ids, ending with its next generation prompt), as
    :func:`sample_responses` makes them (``cfg.max_answer_seq_len`` new tokens at most per row,
    valid up to and including its first token of ``eos_ids``, the recorded log-probs and
    entropies).

    A backend that ``continues_conversations`` continues each row from its own state, reading only
    the tokens it has not seen (:meth:`GenerationBackend.sample_turn`); any other reads each whole
    conversation again, left-padded as a prompt (:meth:`GenerationBackend.sample`): the same
    tokens and log-probs, at the cost of a prefill of the whole conversation every turn.
    ``row_seeds``: (B,) long, this turn's seed of each row (backends with ``seeds_rows``).
    ``device``: where the prompts go (the model's device)."""
    seeds = row_seeds if sampler.seeds_rows else None
    B = len(conversations.token_ids)
    device = torch.device("cpu") if device is None else device
    if sampler.continues_conversations:
        out = sampler.sample_turn(conversations, cfg, eos_ids, pad_id, seeds)
    else:
        prompt_ids, prompt_mask = left_pad(conversations.token_ids, pad_id, device)
        out = sampler.sample(prompt_ids, prompt_mask, cfg, eos_ids, pad_id, seeds)
    return _sampled(out, B, eos_ids, pad_id, device)


def _sampled(out, B: int, eos_ids: list[int], pad_id: int, device) -> Sampled:
    """A backend's ``(response, logprobs, entropy)`` as :class:`Sampled` on ``device``."""
    response, logprobs, entropy = (None if x is None else x.to(device) for x in out)
    if response.shape[1] == 0:  # every row produced nothing: keep one (padding) column
        response = torch.full((B, 1), pad_id, device=device)
        logprobs = entropy = None
    action_mask, ends = response_mask(response, eos_ids)
    response = response.masked_fill(~action_mask, pad_id)
    if logprobs is not None:
        logprobs = logprobs.masked_fill(~action_mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~action_mask, 0.0)
    return Sampled(response, action_mask, ends, logprobs, entropy)
