"""1. Rollout: generate responses, pack them for scoring, and read per-response-token quantities.

Layout. Generation takes left-padded prompts ``(B, P)`` and returns responses ``(B, A)``, right-padded
after each row's first EOS. For scoring, every sequence is packed *flush left* — prompt tokens, then
response tokens, then padding — so all four models see ordinary right-padded batches with positions
0, 1, 2, … (as in SFT and RM training). Row ``b``'s response starts at ``response_start[b]`` (its
prompt length); the logit at position ``t`` predicts token ``t+1``, so response token ``j`` is scored by
the logit at ``response_start[b] − 1 + j``, and the critic's value of the state before token ``j`` is read
at the same position.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from marlhf.data.config import DataConfig
    from marlhf.rl.config import GenerationConfig, PPOStageConfig
    from marlhf.rl.models import Models


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


def gather_response(
    x: torch.Tensor, response_start: torch.Tensor, num_actions: int
) -> torch.Tensor:
    """Read per-position quantities at the positions that predict/precede each response token.

    x: (B, T) or (B, T, ...) indexed by position t, where position t looks at tokens ≤ t.
    Returns (B, A, ...) with element j = x[b, response_start[b] − 1 + j] (clamped inside the row;
    entries past a row's response are meaningless and masked by the caller).
    """
    B, T = x.shape[:2]
    j = torch.arange(num_actions, device=x.device)
    idx = (response_start.to(x.device).unsqueeze(1) - 1 + j).clamp(0, T - 1)  # (B, A)
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(a_j | s_j) (and the entropy of π(· | s_j)) for every response token.

    logits: (B, T, V) already divided by the sampling temperature; sequences: (B, T).
    Returns (logprobs (B, A), entropy (B, A) or None).
    """
    from marlhf.logprobs import entropy_from_logits, token_logprobs

    B, T, V = logits.shape
    j = torch.arange(num_actions, device=logits.device)
    pos = (response_start.to(logits.device).unsqueeze(1) - 1 + j).clamp(0, T - 2)  # (B, A)
    sel = torch.gather(logits, 1, pos.unsqueeze(-1).expand(B, num_actions, V))  # (B, A, V)
    labels = torch.gather(sequences, 1, pos + 1)  # (B, A)
    logp = token_logprobs(sel, labels)
    ent = entropy_from_logits(sel) if with_entropy else None
    return logp, ent


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


def resolve_backend(cfg: PPOStageConfig, model_config) -> str:
    """``--generation_backend`` with ``auto`` resolved for the actor's config: ``static`` for a
    full-attention model of :data:`STATIC_MODEL_TYPES` (no sliding window), unless the actor is
    ZeRO-3 partitioned without ``--enable_zero3_generation_gather``; else ``hf``."""
    g = cfg.generation
    if g.generation_backend != "auto":
        return g.generation_backend
    if cfg.models.actor_zero_stage == 3 and not g.enable_zero3_generation_gather:
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


def _sample(actor, prompt_ids, prompt_mask, g: GenerationConfig, eos_ids, pad_id, row_seeds):
    """Response tokens (B, A') from the actor's module, A' <= --max_answer_seq_len; the static
    backend also returns their log-probs and entropies (B, A') (None, None from ``hf``)."""
    if g.generation_backend == "static":
        from marlhf.decode import sample

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
        )
    from marlhf.distributed import world_size

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
    models: Models,
    batch: dict,
    cfg: PPOStageConfig,
    tokenizer,
    eos_ids: list[int],
    row_seeds: torch.Tensor | None = None,
) -> Rollout:
    """Sample one response per prompt of ``batch`` with the actor.

    ``row_seeds`` ((B,) long, static and vllm backends): the static decoder's counter-based noise,
    or each vLLM request's seed, so each row's response depends on its seed and prompt, not on the
    rows beside it; ``None`` draws from the global RNG (the engine's RNG with vllm). The ``hf`` backend (``model.generate``) always draws from the global RNG, one stream
    per rank, and left-pads to the local batch: its samples depend on how the batch is split."""
    g = cfg.generation
    actor = models.actor
    device = actor.device
    prompt_ids = batch["input_ids"].to(device)
    prompt_mask = batch["attention_mask"].to(device)
    if g.generation_backend == "vllm":  # the engine of marlhf.rl.vllm_rollout, synced weights
        response_ids, logprobs = models.rollout.sample(
            prompt_ids, prompt_mask, max_new_tokens=g.max_answer_seq_len, top_k=g.top_k,
            top_p=g.top_p, eos_ids=eos_ids, pad_id=tokenizer.pad_token_id, row_seeds=row_seeds,
            temperature=g.temperature,
        )  # fmt: skip
        entropy = None  # vLLM returns none
    else:
        actor.eval()
        with _zero3_gather(actor, g.enable_zero3_generation_gather):
            response_ids, logprobs, entropy = _sample(
                actor, prompt_ids, prompt_mask, g, eos_ids, tokenizer.pad_token_id, row_seeds
            )
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
    return Rollout(seq, att, start, response_ids, action_mask, ends, prompt_id, logprobs, entropy)


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
        torch.cat([pad_right(r.sequences, T, pad_id) for r in rollouts]),
        torch.cat([pad_right(r.attention_mask, T, False) for r in rollouts]),
        torch.cat([r.response_start for r in rollouts]),
        torch.cat([pad_right(r.response_ids, A, pad_id) for r in rollouts]),
        torch.cat([pad_right(r.action_mask, A, False) for r in rollouts]),
        torch.cat([r.ends_with_eos for r in rollouts]),
        sum((r.prompt_ids for r in rollouts), []),
        *(_cat_recorded([getattr(r, k) for r in rollouts], A) for k in ("logprobs", "entropy")),
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
        ro.sequences[idx, :t],
        ro.attention_mask[idx, :t],
        ro.response_start[idx],
        ro.response_ids[idx, :a],
        ro.action_mask[idx, :a],
        ro.ends_with_eos[idx],
        [ro.prompt_ids[i] for i in idx.tolist()],
        None if ro.logprobs is None else ro.logprobs[idx, :a],
        None if ro.entropy is None else ro.entropy[idx, :a],
    )
