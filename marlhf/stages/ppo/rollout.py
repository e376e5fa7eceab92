"""1. Rollout: generate responses with the actor and pack them for scoring (the layout of a packed
batch: :mod:`marlhf.models.sequences`).

A multi-turn rollout (``--env``, :mod:`marlhf.stages.ppo.multiturn`) keeps this layout for the
actions: ``sequences`` hold each whole conversation (the first prompt, then actions and
observations interleaved), and ``response_ids`` only the policy's tokens, *compacted*: row ``b``'s
actions left-aligned in order, ``action_positions[b, j]`` the place of action ``j`` in the
conversation after its first prompt. Everything that reads ``(B, A)`` tensors (the termination
rules, rewards, estimators, losses, metrics) then sees the actions alone, as in a single-turn
rollout, and the forward passes read each action's log-prob and value where it sits in the
conversation: observations get no advantage, no KL and no entropy by construction.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from marlhf.models.generation import GenerationBackend
from marlhf.models.generation.sampling import sample_responses
from marlhf.models.sequences import pack_flush_left
from marlhf.runtime.engine import gathered_for_generation

if TYPE_CHECKING:
    from marlhf.data.config import DataConfig
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
    # a multi-turn rollout (module doc; None otherwise): where each action sits in the response
    # (the conversation after the first prompt), 0 on padding; each turn's last action token
    # (where its reward goes); the turn of each action (1, 2, ...; 0 on padding); the rewards the
    # environment gave, each on its turn's last action token (0 elsewhere)
    action_positions: torch.Tensor | None = None  # (B, A) long
    turn_end: torch.Tensor | None = None  # (B, A) bool
    turn_index: torch.Tensor | None = None  # (B, A) long
    turn_rewards: torch.Tensor | None = None  # (B, A) float32


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


def zero3_gather(engine, enabled: bool):
    """The context in which a backend samples with ``engine``'s module: its ZeRO-3 weights gathered
    when ``enabled`` (``--enable_zero3_generation_gather``), its forward passes then local to each
    rank (:func:`marlhf.runtime.engine.gathered_for_generation`), else nothing."""
    if not enabled or engine.zero_optimization_stage() != 3:
        return nullcontext()
    return gathered_for_generation(engine)


@torch.no_grad()
def generate(
    actor,
    sampler: GenerationBackend,
    batch: dict,
    g: GenerationConfig,
    tokenizer,
    eos_ids: list[int],
    row_seeds: torch.Tensor | None = None,
) -> Rollout:
    """Sample one response per prompt of ``batch`` by the run's ``sampler`` (the backend of
    ``--generation_backend``, :mod:`marlhf.models.generation`), as ``g`` (``--max_answer_seq_len``,
    temperature, ...) says. A backend that samples with the ``actor`` engine's module does so in
    eval mode, its ZeRO-3 weights gathered with ``--enable_zero3_generation_gather``; one with an
    engine of its own (vLLM) has the actor's weights synced into it
    (:mod:`marlhf.stages.ppo.sampler`).

    ``row_seeds`` ((B,) long): each row's seed for a backend that seeds rows (static, vllm), so
    each row's response depends on its seed and prompt, not on the rows beside it; ``None`` draws
    from the global RNG. The ``hf`` backend (``model.generate``) always draws from the global RNG,
    one stream per rank, and left-pads to the local batch: its samples depend on how the batch is
    split."""
    device = actor.device
    prompt_ids = batch["input_ids"].to(device)
    prompt_mask = batch["attention_mask"].to(device)
    pad = tokenizer.pad_token_id
    if sampler.uses_model:
        actor.eval()
        with zero3_gather(actor, g.enable_zero3_generation_gather):
            out = sample_responses(sampler, prompt_ids, prompt_mask, g, eos_ids, pad, row_seeds)
        actor.train()
    else:
        out = sample_responses(sampler, prompt_ids, prompt_mask, g, eos_ids, pad, row_seeds)
    seq, att, start = pack_flush_left(
        prompt_ids, prompt_mask, out.response_ids, out.action_mask, pad
    )
    return Rollout(
        sequences=seq,
        attention_mask=att,
        response_start=start,
        response_ids=out.response_ids,
        action_mask=out.action_mask,
        ends_with_eos=out.ends_with_eos,
        prompt_ids=list(batch["prompt_id"]),
        logprobs=out.logprobs,
        entropy=out.entropy,
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
        **{
            k: torch.cat([pad_right(getattr(r, k), A, pad) for r in rollouts])
            for k, pad in TURN_FIELDS.items()
            if getattr(rollouts[0], k) is not None
        },
    )


# the per-action fields of a multi-turn rollout and their padding
TURN_FIELDS = {"action_positions": 0, "turn_end": False, "turn_index": 0, "turn_rewards": 0.0}


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
        **{k: getattr(ro, k)[idx, :a] for k in TURN_FIELDS if getattr(ro, k) is not None},
    )
