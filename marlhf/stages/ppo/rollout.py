"""1. Rollout: generate responses with the actor and pack them for scoring (the layout of a packed
batch: :mod:`marlhf.models.sequences`)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from marlhf.models.decode import sample
from marlhf.models.sequences import pack_flush_left, response_mask
from marlhf.runtime.distributed import world_size

if TYPE_CHECKING:
    from marlhf.data.config import DataConfig
    from marlhf.models.vllm_engine import VLLMEngine
    from marlhf.stages.ppo.config import GenerationConfig


@dataclass
class Rollout:
    """One batch of generated experience (B rows)."""

    sequences: torch.Tensor  # (B, T) long  prompt ⧺ response, flush-left, right-padded
    attention_mask: torch.Tensor  # (B, T) bool
    response_start: torch.Tensor  # (B,) long  index of the first response token in `sequences`
    response_ids: torch.Tensor  # (B, A) long  right-padded (pad after the first EOS)
    action_mask: torch.Tensor  # (B, A) bool  valid response tokens (a prefix; includes the EOS)
    ends_with_eos: torch.Tensor  # (B,) bool  false for responses cut at max length
    prompt_ids: list[str]  # dataset prompt ids, for logging and code rewards
    # recorded while sampling (None otherwise): log π_old(a_j | s_j) (static decoder and vLLM) and
    # the entropy of π_old(· | s_j) (static decoder only) at the sampling temperature, before
    # top-k/top-p; 0 on padding
    logprobs: torch.Tensor | None = None  # (B, A) float32
    entropy: torch.Tensor | None = None  # (B, A) float32


# --------------------------------------------------------------------------------------------------
# 1. generate: sample responses with the actor


def eos_token_ids(tokenizer, data: DataConfig) -> list[int]:
    """Generation stops at the tokenizer's EOS and at a single-token end-of-conversation token."""
    ids = [tokenizer.eos_token_id]
    if data.end_of_conversation_token:
        eot = tokenizer(data.end_of_conversation_token, add_special_tokens=False)["input_ids"]
        if len(eot) == 1 and eot[0] not in ids:
            ids.append(eot[0])
    return ids


# the backends that seed each row's draws from (--seed, step, its global row): split-independent
SEEDED_BACKENDS = ("static", "vllm")

# model families the static decoder is tested on (full attention, 4-D additive masks)
STATIC_MODEL_TYPES = ("gemma", "llama", "mistral", "qwen2", "qwen3")


def resolve_backend(g: GenerationConfig, actor_zero_stage: int, model_config) -> str:
    """The decoder of the rollouts: ``--generation_backend``, with ``auto`` resolved for the
    actor's config: ``static`` for a full-attention model of :data:`STATIC_MODEL_TYPES` (no sliding
    window), unless the actor is ZeRO-3 partitioned (``actor_zero_stage``) without
    ``--enable_zero3_generation_gather``; else ``hf``. The config keeps ``auto``: the loop carries
    the resolved name."""
    if g.generation_backend != "auto":
        return g.generation_backend
    if actor_zero_stage == 3 and not g.enable_zero3_generation_gather:
        return "hf"
    text = (
        model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    )
    layer_types = getattr(text, "layer_types", None) or []
    full = all(t == "full_attention" for t in layer_types)
    windowed = getattr(text, "sliding_window", None) is not None and (
        getattr(text, "use_sliding_window", True) is not False
    )
    ok = getattr(text, "model_type", None) in STATIC_MODEL_TYPES and full and not windowed
    return "static" if ok else "hf"


def _zero3_gather(engine, enabled: bool):
    if not enabled or engine.zero_optimization_stage() != 3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


def _sample(
    actor, prompt_ids, prompt_mask, g: GenerationConfig, backend: str, eos_ids, pad_id, row_seeds
):
    """Response tokens (B, A') from the actor's module, A' <= --max_answer_seq_len; the static
    backend also returns their log-probs and entropies (B, A') (None, None from ``hf``)."""
    if backend == "static":
        return sample(
            actor.module,
            prompt_ids,
            prompt_mask,
            max_new_tokens=g.max_answer_seq_len,
            temperature=g.temperature,
            top_k=g.top_k,
            top_p=g.top_p,
            eos_ids=eos_ids,
            pad_id=pad_id,
            row_seeds=row_seeds,  # None: the global RNG, seeded and restored on resume
            compile=g.compile_generation,
            prompt_bucket=g.max_prompt_seq_len,
            return_logprobs=True,
            # ZeRO-3: parameters gathered here must not become inference tensors (scoring.py)
            inference_mode=actor.zero_optimization_stage() != 3,
        )

    zero3 = actor.zero_optimization_stage() == 3
    out = actor.module.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        do_sample=True,
        temperature=g.temperature,
        top_k=g.top_k if g.top_k > 0 else None,
        top_p=g.top_p,
        max_new_tokens=g.max_answer_seq_len,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        synced_gpus=zero3 and not g.enable_zero3_generation_gather and world_size() > 1,
        use_cache=True,
    )
    return out[:, prompt_ids.shape[1] :], None, None


@torch.no_grad()
def generate(
    actor,
    batch: dict,
    g: GenerationConfig,
    backend: str,
    tokenizer,
    eos_ids: list[int],
    row_seeds: torch.Tensor | None = None,
    engine: VLLMEngine | None = None,
) -> Rollout:
    """Sample one response per prompt of ``batch`` with the ``actor`` engine, by the ``backend``
    decoder (:func:`resolve_backend`), as ``g`` (``--max_answer_seq_len``, temperature, ...) says;
    with ``vllm`` the rollout ``engine`` samples (the actor's weights synced into it by
    :mod:`marlhf.stages.ppo.vllm_rollout`).

    ``row_seeds`` ((B,) long, static and vllm backends): the static decoder's counter-based noise,
    or each vLLM request's seed, so each row's response depends on its seed and prompt, not on the
    rows beside it; ``None`` draws from the global RNG (the engine's RNG with vllm). The ``hf``
    backend (``model.generate``) always draws from the global RNG, one stream per rank, and
    left-pads to the local batch: its samples depend on how the batch is split."""
    device = actor.device
    prompt_ids = batch["input_ids"].to(device)
    prompt_mask = batch["attention_mask"].to(device)
    if backend == "vllm":
        response_ids, logprobs = engine.sample(
            prompt_ids, prompt_mask, max_new_tokens=g.max_answer_seq_len, top_k=g.top_k,
            top_p=g.top_p, eos_ids=eos_ids, pad_id=tokenizer.pad_token_id, row_seeds=row_seeds,
            temperature=g.temperature,
        )  # fmt: skip
        entropy = None  # vLLM returns none
    else:
        actor.eval()
        with _zero3_gather(actor, g.enable_zero3_generation_gather):
            response_ids, logprobs, entropy = _sample(
                actor, prompt_ids, prompt_mask, g, backend, eos_ids, tokenizer.pad_token_id,
                row_seeds,
            )  # fmt: skip
        actor.train()
    if response_ids.shape[1] == 0:  # every row produced nothing: keep one (padding) column
        response_ids = torch.full((prompt_ids.shape[0], 1), tokenizer.pad_token_id, device=device)
        logprobs = entropy = None
    action_mask, ends = response_mask(response_ids, eos_ids)
    response_ids = response_ids.masked_fill(~action_mask, tokenizer.pad_token_id)
    if logprobs is not None:
        logprobs = logprobs.masked_fill(~action_mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~action_mask, 0.0)
    seq, att, start = pack_flush_left(
        prompt_ids, prompt_mask, response_ids, action_mask, tokenizer.pad_token_id
    )
    prompt_id = list(batch["prompt_id"])
    return Rollout(
        sequences=seq,
        attention_mask=att,
        response_start=start,
        response_ids=response_ids,
        action_mask=action_mask,
        ends_with_eos=ends,
        prompt_ids=prompt_id,
        logprobs=logprobs,
        entropy=entropy,
    )


def pad_right(x: torch.Tensor, width: int, value) -> torch.Tensor:
    """(B, W, ...) -> (B, width, ...) padded with ``value`` on the right of dim 1 (width >= W)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def concat_rollouts(rollouts: list[Rollout], pad_id: int) -> Rollout:
    """Concatenate rollouts of different widths (right-padding sequences and responses)."""
    if len(rollouts) == 1:
        return rollouts[0]
    T = max(r.sequences.shape[1] for r in rollouts)
    A = max(r.response_ids.shape[1] for r in rollouts)
    return Rollout(
        sequences=torch.cat([pad_right(r.sequences, T, pad_id) for r in rollouts]),
        attention_mask=torch.cat([pad_right(r.attention_mask, T, False) for r in rollouts]),
        response_start=torch.cat([r.response_start for r in rollouts]),
        response_ids=torch.cat([pad_right(r.response_ids, A, pad_id) for r in rollouts]),
        action_mask=torch.cat([pad_right(r.action_mask, A, False) for r in rollouts]),
        ends_with_eos=torch.cat([r.ends_with_eos for r in rollouts]),
        prompt_ids=sum((r.prompt_ids for r in rollouts), []),
        logprobs=_cat_recorded([r.logprobs for r in rollouts], A),
        entropy=_cat_recorded([r.entropy for r in rollouts], A),
    )


def _cat_recorded(xs: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
    """Recorded per-token floats of several rollouts, right-padded with 0 (None if any lacks them)."""
    if any(x is None for x in xs):
        return None
    return torch.cat([pad_right(x, width, 0.0) for x in xs])


def sequence_lengths(ro: Rollout) -> torch.Tensor:
    """(B,) long: each row's tokens, prompt and response (its flush-left length)."""
    return ro.attention_mask.sum(1)


def slice_rollout(ro: Rollout, idx: torch.Tensor) -> Rollout:
    """Rows ``idx`` of ``ro``, cut to their longest sequence and response (at least one action)."""
    a = int(ro.action_mask[idx].sum(1).max().clamp(min=1))
    t = int(ro.attention_mask[idx].sum(1).max())
    return Rollout(
        sequences=ro.sequences[idx, :t],
        attention_mask=ro.attention_mask[idx, :t],
        response_start=ro.response_start[idx],
        response_ids=ro.response_ids[idx, :a],
        action_mask=ro.action_mask[idx, :a],
        ends_with_eos=ro.ends_with_eos[idx],
        prompt_ids=[ro.prompt_ids[i] for i in idx.tolist()],
        logprobs=None if ro.logprobs is None else ro.logprobs[idx, :a],
        entropy=None if ro.entropy is None else ro.entropy[idx, :a],
    )
