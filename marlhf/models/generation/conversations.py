"""Multi-turn conversations through a generation backend: :func:`open_conversations`, the call a
multi-turn rollout makes once per batch, then :meth:`Conversations.sample_turn` once per turn
(:class:`~marlhf.models.generation.base.Conversations` states the contract).

A backend with ``continues_conversations`` continues from what it holds (the static decoder's KV
cache: :mod:`marlhf.models.continuation`; vLLM's prefix cache); any other is wrapped in
:class:`ReplayConversations`, which re-reads every conversation from its start at each turn
through the backend's :meth:`~marlhf.models.generation.base.GenerationBackend.sample`. Both give
the same tokens and log-probs for the same seeds (up to float rounding): a turn's seeds are
:func:`turn_seeds`, and a one-turn conversation samples what
:func:`~marlhf.models.generation.sampling.sample_responses` samples with the same row seeds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from marlhf.models.decode import counter_bits
from marlhf.models.generation.base import (
    Conversations,
    GenerationBackend,
    SampledTurn,
    SamplingConfig,
)
from marlhf.models.generation.sampling import sample_responses


def turn_seeds(row_seeds: torch.Tensor, turn: int) -> torch.Tensor:
    """The seeds of turn ``turn`` (0, 1, ...) of rows seeded ``row_seeds`` (B,) long: the row
    seeds themselves at turn 0, else output -1 of the row's SplitMix64 stream of step ``turn``
    (:func:`~marlhf.models.decode.counter_bits`), a value no token's noise uses. A function of the
    row's seed and the turn only.

    >>> s = torch.tensor([7, 8])
    >>> torch.equal(turn_seeds(s, 0), s), torch.equal(turn_seeds(s, 2)[1:], turn_seeds(s[1:], 2))
    (True, True)
    """
    if turn == 0:
        return row_seeds
    return counter_bits(row_seeds, turn, torch.tensor([-1], device=row_seeds.device))[:, 0]


def action_length(ids: Sequence[int], budget: int, eos: set[int]) -> int:
    """Tokens of a sampled row that make the action: up to and including its first EOS, at most
    ``budget``."""
    for i, t in enumerate(ids[:budget]):
        if t in eos:
            return i + 1
    return min(len(ids), budget)


class TrackedConversations(Conversations):
    """What every kind of conversation keeps: each row's tokens so far, its turns, which rows
    still play, and the checks of a turn's call. ``max_len``: the most tokens of a conversation
    (an action is cut where it would pass it)."""

    def __init__(self, prompt_ids: Sequence[Sequence[int]], row_seeds: torch.Tensor, max_len: int):
        if tuple(row_seeds.shape) != (len(prompt_ids),):
            raise ValueError(
                f"row_seeds must have shape ({len(prompt_ids)},), got {tuple(row_seeds.shape)}"
            )
        for r, p in enumerate(prompt_ids):
            if not p:
                raise ValueError(f"row {r}: an empty prompt")
            if len(p) >= max_len:
                raise ValueError(
                    f"row {r}: a prompt of {len(p)} tokens leaves no room for an action within "
                    f"the conversations' {max_len} tokens"
                )
        self.tokens = [[int(t) for t in p] for p in prompt_ids]
        self.row_seeds = row_seeds.detach().to("cpu", torch.long)
        self.max_len = max_len
        self.turns = [0] * len(prompt_ids)  # actions sampled per row
        self.playing = set(range(len(prompt_ids)))

    def conversation(self, row: int) -> list[int]:
        return list(self.tokens[row])

    def begin_turn(
        self, rows: Sequence[int], context_ids: Sequence[Sequence[int]], cfg: SamplingConfig
    ) -> tuple[torch.Tensor, list[int]]:
        """Check a call, append the contexts and drop the rows left out; returns the rows' seeds
        of this turn (len(rows),) and their budgets of new tokens."""
        rows = [int(r) for r in rows]
        if len(context_ids) != len(rows):
            raise ValueError(f"{len(rows)} rows need as many contexts, got {len(context_ids)}")
        unknown = [r for r in rows if r not in self.playing]
        if unknown or len(set(rows)) != len(rows):
            what = f"row {unknown[0]} has ended or does not exist" if unknown else "a row twice"
            raise ValueError(f"sample_turn: {what} (rows {rows})")
        budgets = []
        for r, ids in zip(rows, context_ids, strict=True):
            n = len(self.tokens[r]) + len(ids)
            if n >= self.max_len:
                raise ValueError(
                    f"row {r}: a conversation of {n} tokens leaves no room for an action within "
                    f"the conversations' {self.max_len} tokens"
                )
            budgets.append(min(cfg.max_answer_seq_len, self.max_len - n))
        self.playing = set(rows)
        for r, ids in zip(rows, context_ids, strict=True):
            self.tokens[r].extend(int(t) for t in ids)
        turn = torch.tensor([self.turns[r] for r in rows])
        seeds = self.row_seeds[rows]
        for k in turn.unique().tolist():  # rows are usually at the same turn: one call
            at = turn == k
            seeds[at] = turn_seeds(seeds[at], k)
        return seeds, budgets

    def end_turn(self, rows: Sequence[int], actions: list[list[int]]) -> None:
        for r, a in zip(rows, actions, strict=True):
            self.tokens[r].extend(a)
            self.turns[r] += 1


class ReplayConversations(TrackedConversations):
    """Conversations that ``sampler`` re-reads from their start at every turn: each turn is one
    :func:`~marlhf.models.generation.sampling.sample_responses` call on the rows' whole
    conversations (left-padded) with the turn's seeds, each row cut after its first EOS and at its
    budget. vLLM's conversations are these: its prefix cache keeps the keys and values of what it
    has read, so it computes only the new tokens."""

    def __init__(
        self,
        sampler: GenerationBackend,
        prompt_ids: Sequence[Sequence[int]],
        row_seeds: torch.Tensor,
        max_len: int,
    ):
        super().__init__(prompt_ids, row_seeds, max_len)
        self.sampler = sampler

    def sample_turn(self, rows, context_ids, cfg, eos_ids, pad_id) -> SampledTurn:
        seeds, budgets = self.begin_turn(rows, context_ids, cfg)
        seqs = [self.tokens[r] for r in rows]
        P = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
        mask = torch.zeros(len(seqs), P, dtype=torch.bool)
        for i, s in enumerate(seqs):
            ids[i, P - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, P - len(s) :] = True
        turn_cfg = copy.copy(cfg)
        turn_cfg.max_answer_seq_len = max(budgets)
        out = sample_responses(self.sampler, ids, mask, turn_cfg, eos_ids, pad_id, seeds)
        eos = set(eos_ids)
        response = out.response_ids.tolist()
        n = [action_length(row, b, eos) for row, b in zip(response, budgets, strict=True)]
        actions = [row[:k] for row, k in zip(response, n, strict=True)]

        def cut(x: torch.Tensor | None) -> list[list[float]] | None:
            return None if x is None else [row[:k] for row, k in zip(x.tolist(), n, strict=True)]

        self.end_turn(rows, actions)
        return SampledTurn(
            actions,
            [bool(a) and a[-1] in eos for a in actions],
            cut(out.logprobs),
            cut(out.entropy),
        )


def open_conversations(
    sampler: GenerationBackend,
    prompt_ids: Sequence[Sequence[int]],
    max_len: int,
    row_seeds: torch.Tensor | None = None,
    replay: bool = False,
) -> Conversations:
    """The conversations of ``prompt_ids`` (one token list per row: the first prompt, rendered
    with its generation prompt) on ``sampler``, each at most ``max_len`` tokens (prompt, actions
    and contexts; an action is cut where it would pass it). ``row_seeds`` (R,) long: each row's
    seed (None: drawn from the global RNG). ``replay``: re-read every conversation at each turn
    even on a backend that continues them (the reference the continuation is checked against)."""
    if row_seeds is None:
        row_seeds = torch.randint(-(2**63), 2**63 - 1, (len(prompt_ids),), dtype=torch.long)
    if sampler.continues_conversations and not replay:
        return sampler.open_conversations(prompt_ids, row_seeds, max_len)
    return ReplayConversations(sampler, prompt_ids, row_seeds, max_len)
