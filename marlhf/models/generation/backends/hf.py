"""``--generation_backend hf``: transformers' ``model.generate`` on the caller's model.

It draws from the global RNG (the caller seeds it), one stream per process, and left-pads to the
batch it is given: its samples depend on how the prompts are batched and split over ranks. It
records nothing (PPO scores π_old with a forward pass). The one backend that samples from a
ZeRO-3 partitioned model without gathering it (``synced_gpus``: every rank steps until the
longest response of any rank ends); each call is then ``collective``: every rank makes as many."""

from __future__ import annotations

import torch

from marlhf.models.generation.base import SamplerSetup, SamplingConfig
from marlhf.models.generation.registry import HF, register_backend
from marlhf.runtime.distributed import world_size


@register_backend
class HFBackend(HF):
    """``hf`` (declared in :mod:`marlhf.models.generation.registry`): ``model.generate``."""

    def __init__(self, model: torch.nn.Module, synced_gpus: bool) -> None:
        self.model, self.synced_gpus = model, synced_gpus
        self.collective = synced_gpus

    @classmethod
    def open(cls, cfg: SamplingConfig, setup: SamplerSetup) -> HFBackend:
        if setup.model is None:
            raise ValueError("--generation_backend hf samples with the policy: no model was loaded")
        partitioned = setup.zero3 and not setup.gathered
        return cls(setup.model, synced_gpus=partitioned and world_size() > 1)

    @torch.no_grad()
    def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
        device = next(self.model.parameters()).device
        out = self.model.generate(
            input_ids=prompt_ids.to(device),
            attention_mask=prompt_mask.long().to(device),
            do_sample=True,
            temperature=cfg.temperature,
            top_k=cfg.top_k if cfg.top_k > 0 else None,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_answer_seq_len,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
            synced_gpus=self.synced_gpus,
            use_cache=True,
        )
        return out[:, prompt_ids.shape[1] :].to(prompt_ids.device), None, None
