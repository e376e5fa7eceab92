"""``--generation_backend static``: the static-KV-cache decoder (:mod:`marlhf.models.decode`) on
the caller's model.

Each row's noise is counter-based from its seed (``row_seeds``), so a row samples the same response
in any batch and on any number of ranks; it records the sampled tokens' log-probs and the entropies
at the sampling temperature, before top-k/top-p (PPO skips one actor forward). Full-attention
models only (:data:`~marlhf.models.generation.registry.STATIC_MODEL_TYPES`, no sliding window);
under ZeRO-3 the caller gathers the weights around each call.

It continues multi-turn conversations (:meth:`StaticBackend.sample_turn`): a KV cache holds the
conversations of the rows it was started with (:class:`~marlhf.models.continuation.ContinuedDecoder`),
and each turn prefills only the rows' new tokens, until
:meth:`~marlhf.models.generation.base.GenerationBackend.end_conversations`. Rows sampled in
groups that take turns (``--env_overlap``: the environments step one group while the policy
samples another) get a cache per group."""

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
        # the conversations continued (sample_turn): one cache per group of rows
        self._caches: list[_Cache] = []

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
        """Continue the rows from the KV cache that holds every row of the call, when what it
        holds of each row begins the row's conversation; else (a new batch of episodes, a row
        the cache has dropped, an action the caller cut short) start a cache of this call's rows
        from their whole conversations (each row leaves any other cache). The rows of a cache
        left out of a call on it leave it for good. ``row_seeds`` (B,) long (None: drawn from
        the global RNG). Returns (response_ids (B, A') long, right-padded with ``pad_id``;
        logprobs, entropy (B, A') float32) on the CPU."""
        rows, token_ids = [int(r) for r in conversations.rows], conversations.token_ids
        if len(set(rows)) != len(rows):
            raise ValueError(f"sample_turn: a row named twice (rows {rows})")
        B = len(rows)
        if row_seeds is None:
            row_seeds = torch.randint(0, 2**62, (B,), dtype=torch.long)
        cache = next((c for c in self._caches if c.continues(rows, token_ids)), None)
        if cache is not None:
            at = [cache.at[r] for r in rows]
            new = [list(ids[len(cache.held[r]) :]) for r, ids in zip(rows, token_ids, strict=True)]
            cache.keep(rows)
        else:
            for c in self._caches:
                c.forget(rows)
            longest = max(len(ids) for ids in token_ids) + cfg.max_answer_seq_len
            cache = _Cache(ContinuedDecoder(self.model, B, longest, self.inference_mode), rows)
            self._caches.append(cache)
            at, new = list(range(B)), [list(ids) for ids in token_ids]
        actions, logprobs, entropy = cache.decoder.sample(
            at, new, [cfg.max_answer_seq_len] * B, row_seeds, temperature=cfg.temperature,
            top_k=cfg.top_k, top_p=cfg.top_p, eos_ids=eos_ids, pad_id=pad_id,
        )  # fmt: skip
        for r, ids, a in zip(rows, token_ids, actions, strict=True):
            cache.held[r] = [*ids, *a]
        self._caches = [c for c in self._caches if c.held]  # a cache no row uses any more
        A = max(1, max(len(a) for a in actions))
        response = torch.full((B, A), pad_id, dtype=torch.long)
        lp, ent = torch.zeros(B, A), torch.zeros(B, A)
        for b, (a, p, e) in enumerate(zip(actions, logprobs, entropy, strict=True)):
            response[b, : len(a)] = torch.tensor(a, dtype=torch.long)
            lp[b, : len(a)], ent[b, : len(a)] = torch.tensor(p), torch.tensor(e)
        return response, lp, ent

    def end_conversations(self) -> None:
        self._caches = []  # the KV caches go with their decoders


class _Cache:
    """One KV cache of continued conversations: its decoder, each row's index in it, and the
    tokens it holds of each row (read, or sampled and not yet read)."""

    def __init__(self, decoder: ContinuedDecoder, rows: list[int]) -> None:
        self.decoder = decoder
        self.at = {r: b for b, r in enumerate(rows)}
        self.held: dict[int, list[int]] = {}

    def continues(self, rows: list[int], token_ids) -> bool:
        """Whether this cache holds every row of the call and what it holds of each begins the
        row's conversation. ``held`` names the rows the decoder still has: both drop the rows left
        out of a call (:meth:`keep` before the decoder's call)."""
        for r, ids in zip(rows, token_ids, strict=True):
            held = self.held.get(r)
            if held is None:
                return False
            if len(held) > len(ids) or list(ids[: len(held)]) != held:
                return False
        return True

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` go on (the decoder drops the others at this call)."""
        self.held = {r: self.held[r] for r in rows}

    def forget(self, rows: list[int]) -> None:
        """``rows`` left this cache (another holds them now)."""
        for r in rows:
            self.held.pop(r, None)
