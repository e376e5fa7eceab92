"""The one sampling call every program makes (PPO's rollouts, its evaluation and its Monte-Carlo
continuations, ``marlhf infer``): a backend's raw responses made into :class:`Sampled`, valid up to
and including each row's first EOS."""

from __future__ import annotations

import torch

from marlhf.models.generation.base import GenerationBackend, Sampled, SamplingConfig
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
    response, logprobs, entropy = sampler.sample(
        prompt_ids, prompt_mask, cfg, eos_ids, pad_id, seeds
    )
    if response.shape[1] == 0:  # every row produced nothing: keep one (padding) column
        response = torch.full((prompt_ids.shape[0], 1), pad_id, device=prompt_ids.device)
        logprobs = entropy = None
    action_mask, ends = response_mask(response, eos_ids)
    response = response.masked_fill(~action_mask, pad_id)
    if logprobs is not None:
        logprobs = logprobs.masked_fill(~action_mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~action_mask, 0.0)
    return Sampled(response, action_mask, ends, logprobs, entropy)
