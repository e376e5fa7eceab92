"""Sampling one response per prompt row with ``model.generate`` and the stop tokens of the policy."""

from __future__ import annotations

from typing import Any

import torch

from marlhf.inference.config import InferenceConfig
from marlhf.models.sequences import response_mask


def eos_ids(tokenizer: Any, model: Any, cfg: InferenceConfig) -> list[int]:
    """Stop tokens: the tokenizer's eos, the generation config's, ``--end_of_conversation_token``."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
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
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    cfg: InferenceConfig,
    eos_ids: list[int],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one response per row.

    prompt_ids, prompt_mask: (B, P) left-padded. Returns (response_ids (B, A) long right-padded
    with ``pad_id`` after the first EOS, action_mask (B, A) bool, ends_with_eos (B,) bool), on CPU.
    """
    device = next(model.parameters()).device
    out = model.generate(
        input_ids=prompt_ids.to(device),
        attention_mask=prompt_mask.long().to(device),
        do_sample=True,
        temperature=cfg.temperature,
        top_k=cfg.top_k if cfg.top_k > 0 else None,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
    )
    response = out[:, prompt_ids.shape[1] :].cpu()
    if response.shape[1] == 0:
        response = torch.full((prompt_ids.shape[0], 1), pad_id, dtype=torch.long)
    action_mask, ends_with_eos = response_mask(response, eos_ids)
    response = response.masked_fill(~action_mask, pad_id)
    return response, action_mask, ends_with_eos
