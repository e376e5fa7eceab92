"""``--generation_backend static``: the static-KV-cache decoder (:mod:`marlhf.models.decode`) on
the caller's model.

Each row's noise is counter-based from its seed (``row_seeds``), so a row samples the same response
in any batch and on any number of ranks; it records the sampled tokens' log-probs and the entropies
at the sampling temperature, before top-k/top-p (PPO skips one actor forward). Full-attention
models only (:data:`~marlhf.models.generation.registry.STATIC_MODEL_TYPES`, no sliding window);
under ZeRO-3 the caller gathers the weights around each call.

It continues conversations (:class:`StaticConversations`): one KV cache per batch of
conversations, each turn prefilling only the rows' new tokens (:mod:`marlhf.models.continuation`)."""

from __future__ import annotations

from typing import Any

from marlhf.models.continuation import ContinuedDecoder
from marlhf.models.decode import sample
from marlhf.models.generation.base import SampledTurn, SamplerSetup, SamplingConfig
from marlhf.models.generation.conversations import TrackedConversations
from marlhf.models.generation.registry import Static, register_backend


@register_backend
class StaticBackend(Static):
    """``static`` (declared, with the models it supports, in
    :mod:`marlhf.models.generation.registry`): the static-KV-cache decoder."""

    def __init__(self, model: Any, inference_mode: bool) -> None:
        self.model, self.inference_mode = model, inference_mode

    @classmethod
    def open(cls, cfg: SamplingConfig, setup: SamplerSetup) -> StaticBackend:
        if setup.model is None:
            raise ValueError(
                "--generation_backend static samples with the policy: no model was loaded"
            )
        # ZeRO-3: parameters gathered around the call must not become inference tensors
        return cls(setup.model, inference_mode=not setup.zero3)

    def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
        device = next(self.model.parameters()).device
        out = sample(
            self.model,
            prompt_ids.to(device),
            prompt_mask.to(device),
            max_new_tokens=cfg.max_answer_seq_len,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            eos_ids=eos_ids,
            pad_id=pad_id,
            row_seeds=row_seeds,  # None: the global RNG
            compile=cfg.compile_generation,
            prompt_bucket=cfg.max_prompt_seq_len,
            return_logprobs=True,
            inference_mode=self.inference_mode,
        )
        return tuple(x.to(prompt_ids.device) for x in out)

    def open_conversations(self, prompt_ids, row_seeds, max_len) -> StaticConversations:
        return StaticConversations(self.model, prompt_ids, row_seeds, max_len, self.inference_mode)


class StaticConversations(TrackedConversations):
    """Conversations in one KV cache of the static decoder
    (:class:`~marlhf.models.continuation.ContinuedDecoder`): a turn prefills each row's new tokens
    and decodes, with the turn's seeds
    (:func:`~marlhf.models.generation.conversations.turn_seeds`)."""

    def __init__(self, model, prompt_ids, row_seeds, max_len: int, inference_mode: bool = True):
        super().__init__(prompt_ids, row_seeds, max_len)
        self.decoder = ContinuedDecoder(model, len(prompt_ids), max_len, inference_mode)
        for r, p in enumerate(self.tokens):
            self.decoder.pending[r] = list(p)

    def sample_turn(self, rows, context_ids, cfg, eos_ids, pad_id) -> SampledTurn:
        if self.decoder is None:
            raise ValueError("sample_turn: the conversations are closed")
        seeds, budgets = self.begin_turn(rows, context_ids, cfg)
        actions, logprobs, entropy = self.decoder.sample(
            rows, context_ids, budgets, seeds, temperature=cfg.temperature, top_k=cfg.top_k,
            top_p=cfg.top_p, eos_ids=eos_ids, pad_id=pad_id,
        )  # fmt: skip
        self.end_turn(rows, actions)
        eos = set(eos_ids)
        return SampledTurn(actions, [a[-1] in eos for a in actions], logprobs, entropy)

    def close(self) -> None:
        self.decoder = None  # its KV cache goes with it
