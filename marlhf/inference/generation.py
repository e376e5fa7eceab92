"""Sampling one response per prompt row by the generation backend, and the stop tokens of the
policy."""

from __future__ import annotations

from typing import Any

import torch

from marlhf.inference.config import InferenceConfig
from marlhf.models.generation import GenerationBackend
from marlhf.models.generation.sampling import sample_responses
from marlhf.models.load import resolve_model_path


def _generation_config(name: str) -> Any:
    """The generation config saved with model ``name`` (None without one)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(resolve_model_path(name))
    except OSError:
        return None


def eos_ids(tokenizer: Any, model: Any, cfg: InferenceConfig) -> list[int]:
    """Stop tokens: the tokenizer's eos, the generation config's (``model``'s, or the one saved
    with ``--model_name_or_path`` when the policy is not loaded), ``--end_of_conversation_token``."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = (
        _generation_config(cfg.model)
        if model is None
        else getattr(model, "generation_config", None)
    )
    gen_eos = getattr(gen, "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(x) for x in (gen_eos if isinstance(gen_eos, list) else [gen_eos]))
    if cfg.end_of_conversation_token:
        tok = tokenizer(cfg.end_of_conversation_token, add_special_tokens=False)["input_ids"]
        if len(tok) != 1:
            raise ValueError(
                f"--end_of_conversation_token {cfg.end_of_conversation_token!r} must be one token "
                f"to stop generation, got {len(tok)}"
            )
        ids.add(int(tok[0]))
    if not ids:
        raise ValueError(
            f"{cfg.model}: neither the tokenizer nor the generation config has an eos token"
        )
    return sorted(ids)


@torch.no_grad()
def generate(
    sampler: GenerationBackend,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    cfg: InferenceConfig,
    eos_ids: list[int],
    pad_id: int,
    row_seeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one response per row by ``sampler`` (the backend of ``--generation_backend``,
    :mod:`marlhf.models.generation`) with the sampling flags of ``cfg``.

    prompt_ids, prompt_mask: (B, P) left-padded; ``row_seeds`` (B,) long: each row's seed, for a
    backend that seeds rows (the others draw from the global RNG). Returns (response_ids (B, A)
    long right-padded with ``pad_id`` after the first EOS, action_mask (B, A) bool, ends_with_eos
    (B,) bool), on CPU.
    """
    out = sample_responses(
        sampler, prompt_ids, prompt_mask, cfg.sampling, eos_ids, pad_id, row_seeds
    )
    return out.response_ids.cpu(), out.action_mask.cpu(), out.ends_with_eos.cpu()
