"""``--generation_backend static``: the static-KV-cache decoder (:mod:`marlhf.models.decode`) on
the caller's model.

Each row's noise is counter-based from its seed (``row_seeds``), so a row samples the same response
in any batch and on any number of ranks; it records the sampled tokens' log-probs and the entropies
at the sampling temperature, before top-k/top-p (PPO skips one actor forward). Full-attention
models only (:data:`~marlhf.models.generation.registry.STATIC_MODEL_TYPES`, no sliding window);
under ZeRO-3 the caller gathers the weights around each call.

It continues multi-turn conversations (:meth:`StaticBackend.sample_turn`): one KV cache holds a
batch of episodes' conversations (:class:`~marlhf.models.continuation.ContinuedDecoder`), and each
turn prefills only the rows' new tokens, until
:meth:`~marlhf.models.generation.base.GenerationBackend.end_conversations`."""

from __future__ import annotations

from typing import Any

import torch

from marlhf.models.continuation import ContinuedDecoder
from marlhf.models.decode import sample
from marlhf.models.generation.base import Conversations, SamplerSetup, SamplingConfig
from marlhf.models.generation.registry import Static, register_backend


@register_backend
class StaticBackend(Static):
    """``static`` (declared, with the models it supports, in
    :mod:`marlhf.models.generation.registry`): the static-KV-cache decoder."""

    def __init__(self, model: Any, inference_mode: bool) -> None:
        self.model, self.inference_mode = model, inference_mode
        # the conversations continued (sample_turn): the KV cache, each row's index in it, and
        # the tokens it holds of each row (read, or sampled and not yet read)
        self._decoder: ContinuedDecoder | None = None
        self._at: dict[int, int] = {}
        self._held: dict[int, list[int]] = {}

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

    def sample_turn(self, conversations: Conversations, cfg, eos_ids, pad_id, row_seeds=None):
        """Continue each row from the KV cache of the batch's conversations when the cache holds
        every row of the call and what it holds of each row begins the row's conversation; else
        (a new batch of episodes, a row the cache has dropped, an action the caller cut short)
        start a cache of this call's rows from their whole conversations. Rows left out of a call
        leave the cache for good. ``row_seeds`` (B,) long (None: drawn from the global RNG).
        Returns (response_ids (B, A') long, right-padded with ``pad_id``; logprobs, entropy (B,
        A') float32) on the CPU."""
        rows, token_ids = [int(r) for r in conversations.rows], conversations.token_ids
        if len(set(rows)) != len(rows):
            raise ValueError(f"sample_turn: a row named twice (rows {rows})")
        B = len(rows)
        if row_seeds is None:
            row_seeds = torch.randint(0, 2**62, (B,), dtype=torch.long)
        if self._continues(rows, token_ids):
            at = [self._at[r] for r in rows]
            new = [list(ids[len(self._held[r]) :]) for r, ids in zip(rows, token_ids, strict=True)]
        else:
            longest = max(len(ids) for ids in token_ids) + cfg.max_answer_seq_len
            self._decoder = ContinuedDecoder(self.model, B, longest, self.inference_mode)
            self._at, self._held = {r: b for b, r in enumerate(rows)}, {}
            at, new = list(range(B)), [list(ids) for ids in token_ids]
        actions, logprobs, entropy = self._decoder.sample(
            at, new, [cfg.max_answer_seq_len] * B, row_seeds, temperature=cfg.temperature,
            top_k=cfg.top_k, top_p=cfg.top_p, eos_ids=eos_ids, pad_id=pad_id,
        )  # fmt: skip
        for r, ids, a in zip(rows, token_ids, actions, strict=True):
            self._held[r] = [*ids, *a]
        A = max(1, max(len(a) for a in actions))
        response = torch.full((B, A), pad_id, dtype=torch.long)
        lp, ent = torch.zeros(B, A), torch.zeros(B, A)
        for b, (a, p, e) in enumerate(zip(actions, logprobs, entropy, strict=True)):
            response[b, : len(a)] = torch.tensor(a, dtype=torch.long)
            lp[b, : len(a)], ent[b, : len(a)] = torch.tensor(p), torch.tensor(e)
        return response, lp, ent

    def _continues(self, rows: list[int], token_ids) -> bool:
        """Whether the cache holds every row of the call and what it holds of each begins the
        row's conversation."""
        if self._decoder is None:
            return False
        for r, ids in zip(rows, token_ids, strict=True):
            held = self._held.get(r)
            if held is None or self._decoder.index[self._at[r]] is None:
                return False
            if len(held) > len(ids) or list(ids[: len(held)]) != held:
                return False
        return True

    def end_conversations(self) -> None:
        self._decoder, self._at, self._held = None, {}, {}  # the KV cache goes with the decoder
