"""The forward passes of PPO: log-probabilities and entropies of the response tokens under a policy
(actor, reference), the critic's values before each response token, and the reward model's value
at every position; by default at the response positions only, over packed rows
(:mod:`marlhf.models.packing`, where the model packs exactly) or else in passes of rows of similar
length (:mod:`marlhf.runtime.length_groups`). Scoring runs them without grad (by a token budget
with ``--max_tokens_per_micro_batch``), the update with grad.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marlhf.models.logprobs import DEFAULT_CHUNK_ELEMENTS, entropy_from_logits, token_logprobs
from marlhf.models.packing import (
    attention_weight,
    pack_rows,
    packed_inputs,
    packing_mode,
    packs,
)
from marlhf.models.response_logits import logits_at
from marlhf.models.sequences import (
    action_offsets,
    gather_response,
    response_logprobs_and_entropy,
    state_positions,
)
from marlhf.runtime.distributed import world_size
from marlhf.runtime.length_groups import Grouping, grouped, run_groups
from marlhf.runtime.micro_batches import split_rows
from marlhf.stages.ppo.rollout import Rollout, sequence_lengths, slice_rollout


def response_positions(ro: Rollout) -> torch.Tensor:
    """(B, A) long: the position whose logit predicts action j of each row, ``response_start[b]
    − 1 + j`` (``+ action_positions[b, j]`` for the actions of a conversation) clamped into the
    row (padding entries are masked by callers)."""
    A, T = ro.response_ids.shape[1], ro.sequences.shape[1]
    start = ro.response_start.to(ro.sequences.device)
    j = action_offsets(start, A, ro.action_positions)
    return (start.unsqueeze(1) - 1 + j).clamp(0, T - 2)


# the no-grad score pass materialises at most this many logits at once (rows are scored in chunks):
# 2^28 = 512 MiB in bf16. With grad (the update's minibatches) every row's logits are kept anyway.
SCORE_CHUNK_ELEMENTS = 2**28


def _vocab_size(module) -> int | None:
    config = getattr(module, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None)


def lockstep(engine) -> bool:
    """Whether ``engine`` must run the same number of forward passes on every rank: a ZeRO-3
    engine (trained or frozen) gathers each layer's weights with a collective in every pass, so
    ranks that split their rows into different numbers of passes (length groups, logit chunks
    sized by the local response width) would wait on each other forever. Such engines score and
    train each batch in one pass."""
    stage = getattr(engine, "zero_optimization_stage", None)
    return world_size() > 1 and callable(stage) and stage() == 3


def _layout(engine, groups: Grouping | None) -> str | None:
    """The packed layout of ``engine``'s passes (:func:`marlhf.models.packing.packing_mode`), or
    None: padded (``groups`` without packing, or a model that does not pack exactly)."""
    if groups is None or not groups.packing:
        return None
    return packing_mode(engine.module)


def _attention(engine, layout: str | None) -> float | None:
    """The attention weight that chooses the packed passes' groups (None: padded)."""
    return None if layout is None else attention_weight(engine.module)


def _in_passes(
    forward, ro: Rollout, widths, groups: Grouping | None, one_pass: bool, layout, attention=None
):
    """``forward(rollout)`` over ``ro``'s rows: without grad in micro-batches of
    ``groups.max_tokens`` positions (as many on every rank for a :func:`lockstep` engine), else
    in one pass for a lockstep engine or the ``varlen`` layout (whose attention costs each row
    its own length only), else in length groups (:func:`_by_length`): padded, or each group
    packed into bins of its own longest row, the groups chosen by the packed cost with the model's
    ``attention`` weight (:func:`marlhf.runtime.length_groups.packed_cost`: a bin's attention costs
    its width squared, so short rows packed apart from a long one may cost less)."""
    budget = groups.max_tokens if groups is not None and not torch.is_grad_enabled() else 0
    if budget:
        lengths = sequence_lengths(ro)
        parts = split_rows(lengths, budget, packed=layout is not None, agree=one_pass)
        if len(parts) == 1:
            return forward(ro)
        return run_groups(lambda rows: forward(slice_rollout(ro, rows)), parts, widths)
    if one_pass or layout == "varlen":
        return forward(ro)
    return _by_length(forward, ro, widths, groups, attention)


def policy_forward(
    engine,
    ro: Rollout,
    temperature: float,
    *,
    with_entropy: bool = False,
    all_positions: bool = False,
    chunk_elements: int = SCORE_CHUNK_ELEMENTS,
    groups: Grouping | None = None,
):
    """(logprobs (B, A), entropy (B, A) | None) of the response tokens under ``engine``'s policy.

    By default the LM head runs at the response positions only
    (:func:`marlhf.models.response_logits.logits_at`), the attention is plain causal, without the
    padding mask (the rows are flush-left: padding only follows a row's tokens, which no real token
    attends to), the temperature is applied block by block inside the chunked log-softmax
    (`marlhf.models.logprobs`), the rows go through the model in passes of rows of similar
    length (``groups``, :mod:`marlhf.runtime.length_groups`), each pass packed with
    ``groups.packing`` where the model packs exactly (:mod:`marlhf.models.packing`), and without
    grad in micro-batches of
    ``groups.max_tokens`` positions and in chunks of at most ``chunk_elements`` logits (B·A·V).
    ``all_positions`` is the reference path (the head at every position, the padding mask passed,
    one padded pass): equal up to float rounding. A :func:`lockstep` engine runs one pass (or, with
    a token budget, as many as every other rank)."""
    if all_positions:
        logits = engine(
            input_ids=ro.sequences, attention_mask=ro.attention_mask.long(), use_cache=False
        ).logits
        logits = logits / temperature
        A = ro.response_ids.shape[1]
        return response_logprobs_and_entropy(
            logits, ro.sequences, ro.response_start, A, with_entropy=with_entropy,
            offsets=ro.action_positions,
        )  # fmt: skip
    one_pass = lockstep(engine)
    layout = _layout(engine, groups)
    A = ro.response_ids.shape[1]

    def forward(r: Rollout):
        return _chunked_forward(
            engine, r, temperature, with_entropy, chunk_elements, one_pass, layout
        )

    return _in_passes(forward, ro, (A, A), groups, one_pass, layout, _attention(engine, layout))


def _chunked_forward(
    engine, ro: Rollout, temperature, with_entropy, chunk_elements, one_pass, layout
):
    """:func:`_response_forward` over ``ro``'s rows, without grad in chunks of at most
    ``chunk_elements`` logits (one chunk for a lockstep engine)."""
    B, A = ro.response_ids.shape
    V = _vocab_size(engine.module)
    rows = B if torch.is_grad_enabled() or not V or one_pass else max(1, chunk_elements // (A * V))
    if rows >= B:
        return _response_forward(engine, ro, temperature, with_entropy, layout=layout)
    block = min(chunk_elements, DEFAULT_CHUNK_ELEMENTS)  # the log-softmax's float32 scratch
    parts = [
        _response_forward(
            engine, _rows(ro, b, min(B, b + rows)), temperature, with_entropy, block, layout
        )
        for b in range(0, B, rows)
    ]
    logp = torch.cat([p[0] for p in parts])
    return logp, torch.cat([p[1] for p in parts]) if with_entropy else None


def _rows(ro: Rollout, b0: int, b1: int) -> Rollout:
    """Rows b0..b1 of ``ro`` at the full widths (T, A)."""
    return Rollout(
        sequences=ro.sequences[b0:b1],
        attention_mask=ro.attention_mask[b0:b1],
        response_start=ro.response_start[b0:b1],
        response_ids=ro.response_ids[b0:b1],
        action_mask=ro.action_mask[b0:b1],
        ends_with_eos=ro.ends_with_eos[b0:b1],
        prompt_ids=ro.prompt_ids[b0:b1],
        action_positions=None if ro.action_positions is None else ro.action_positions[b0:b1],
    )


def _response_forward(
    engine,
    ro: Rollout,
    temperature: float,
    with_entropy: bool,
    block=DEFAULT_CHUNK_ELEMENTS,
    layout: str | None = None,
):
    """One forward pass of :func:`policy_forward`'s default path over all of ``ro``'s rows,
    padded or packed (``layout``); ``block``: the chunked log-softmax's block (logits upcast at
    once)."""
    pos = response_positions(ro)
    if not packs(ro.attention_mask, layout):
        with logits_at(engine.module, pos) as hooked:
            logits = engine(input_ids=ro.sequences, use_cache=False).logits
        if not hooked:  # no LM head to hook: the full (B, T, V) came back
            V = logits.shape[-1]
            logits = torch.gather(logits, 1, pos.unsqueeze(-1).expand(*pos.shape, V))
    else:
        p = pack_rows(ro.sequences, ro.attention_mask, layout=layout)
        flat = p.index.gather(1, pos).clamp(min=0)  # (B, A) places in the packed rows
        with logits_at(engine.module, flat, flat=True) as hooked:
            logits = engine(**packed_inputs(p)).logits
        if not hooked:  # the full (K, C, V) came back
            logits = p.take(logits, pos)
    labels = torch.gather(ro.sequences, 1, pos + 1)
    # the temperature is applied block by block inside (no tempered copy of the logits)
    logp = token_logprobs(logits, labels, temperature=temperature, chunk_elements=block)
    ent = (
        entropy_from_logits(logits, temperature=temperature, chunk_elements=block)
        if with_entropy
        else None
    )
    return logp, ent


def _by_length(forward, ro: Rollout, widths, groups: Grouping | None, attention=None):
    """``forward(rollout)`` over ``ro`` in passes of rows of similar length (``groups``), or in one
    pass (None or one group): :func:`marlhf.runtime.length_groups.grouped` over ``ro``'s rows, each
    group cut to its own longest row (``slice_rollout``); ``attention``: ``forward`` packs, the
    groups are chosen by the packed cost with this weight."""
    if groups is None or groups.max_groups == 1:
        return forward(ro)
    return grouped(
        lambda rows: forward(slice_rollout(ro, rows)), sequence_lengths(ro), widths, groups,
        packed_attention=attention,
    )  # fmt: skip


def value_forward(engine, ro: Rollout, layout: str | None, padding_mask: bool = False):
    """A value model's (critic's, reward model's) values at every position of ``ro``'s rows,
    (B, T): one padded pass (the padding mask passed when ``padding_mask``) or one packed pass
    (``layout``, where it :func:`marlhf.models.packing.packs`), 0 on padding then."""
    if not packs(ro.attention_mask, layout):
        return engine(input_ids=ro.sequences, attention_mask=_mask(ro, padding_mask))
    p = pack_rows(ro.sequences, ro.attention_mask, layout=layout)
    return p.unpack(engine(**packed_inputs(p)))


def critic_forward(
    engine, ro: Rollout, *, all_positions: bool = False, groups: Grouping | None = None
) -> torch.Tensor:
    """V(s_j) for every response token j: the value at the position just before it. (B, A)
    Plain causal attention, packed or in passes of rows of similar length (``groups``), unless
    ``all_positions`` (see :func:`policy_forward`)."""
    layout = None if all_positions else _layout(engine, groups)

    def forward(r: Rollout) -> torch.Tensor:
        A, T = r.response_ids.shape[1], r.sequences.shape[1]
        if not packs(r.attention_mask, layout):
            values = value_forward(engine, r, None, padding_mask=all_positions)
            return gather_response(values, r.response_start, A, r.action_positions)
        p = pack_rows(r.sequences, r.attention_mask, layout=layout)
        values = engine(**packed_inputs(p))  # (K, C)
        return p.take(values, state_positions(r.response_start, A, T, r.action_positions))

    if all_positions:
        return forward(ro)
    A = ro.response_ids.shape[1]
    return _in_passes(forward, ro, A, groups, lockstep(engine), layout, _attention(engine, layout))


def reward_forward(
    engine, ro: Rollout, *, all_positions: bool = False, groups: Grouping | None = None
) -> torch.Tensor:
    """The reward model's value at every position, (B, T); passes as in :func:`critic_forward`.
    Past a row's tokens the values are meaningless (what padding scores, or 0 when grouped or
    packed)."""
    layout = None if all_positions else _layout(engine, groups)

    def forward(r: Rollout) -> torch.Tensor:
        return value_forward(engine, r, layout, padding_mask=all_positions)

    if all_positions:
        return forward(ro)
    T = ro.sequences.shape[1]
    return _in_passes(forward, ro, T, groups, lockstep(engine), layout, _attention(engine, layout))


def _mask(ro: Rollout, padding_mask: bool) -> torch.Tensor | None:
    """The attention mask to pass: none (causal attention; flush-left rows) unless asked."""
    return ro.attention_mask.long() if padding_mask else None


@dataclass
class KeptValues:
    """The critic's forward pass over the first minibatch's rows, run while scoring (with its graph),
    for that minibatch's critic step: its critic is the scoring critic, so the pass is the same."""

    rows: torch.Tensor  # (mb,) long  the rows (:func:`first_minibatch_rows`)
    values: torch.Tensor  # (mb, A') float  V(s_j) over ``slice_rollout(rollout, rows)``, with grad
