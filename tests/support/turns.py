"""Multi-turn conversations played in tokens through a generation backend, turn by turn, the way
multi-turn PPO's ``TurnSampler`` (marlhf/stages/ppo/multiturn.py) calls it, without a chat
template or an environment: the caller gives each row's context tokens before every turn.

:class:`TurnPlayer` keeps each row's tokens and what the backend has seen of them, seeds turn
``k`` (1, 2, ...) of a row with ``turn_seeds(row seed, k)`` (marlhf.runtime.rows) and calls
``sample_turns`` (a backend that continues conversations reads only the new tokens), or, with
``reread``, ``sample_responses`` on the whole conversations left-padded: the reference a
continuation is checked against. Used by tests/models/test_continuation.py,
tests/with_vllm/test_vllm_conversations.py and benchmarks/bench_multiturn.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from marlhf.models.generation import Conversations, GenerationBackend
from marlhf.models.generation.sampling import left_pad, sample_responses, sample_turns
from marlhf.runtime.rows import turn_seeds


@dataclass
class Turn:
    """One call's actions, per row of the call in its order: the tokens (up to and including
    the first EOS, cut at the conversation's length limit), whether each ended with an EOS, and
    the recorded log-probs and entropies (None where the backend records none)."""

    action_ids: list[list[int]]
    ends_with_eos: list[bool]
    logprobs: list[list[float]] | None
    entropy: list[list[float]] | None


class TurnPlayer:
    """Conversations of ``prompt_ids`` (one token list per row) on ``sampler``, at most
    ``max_len`` tokens each; ``row_seeds`` (R,) long."""

    def __init__(
        self,
        sampler: GenerationBackend,
        prompt_ids: Sequence[Sequence[int]],
        row_seeds: torch.Tensor,
        max_len: int,
        reread: bool = False,
    ):
        self.sampler, self.max_len, self.reread = sampler, max_len, reread
        self.tokens = [[int(t) for t in p] for p in prompt_ids]
        self.row_seeds = row_seeds.to(torch.long)
        self.seen = [0] * len(self.tokens)
        self.turns = [0] * len(self.tokens)

    def conversation(self, row: int) -> list[int]:
        return list(self.tokens[row])

    def sample_turn(self, rows, context_ids, cfg, eos_ids: list[int], pad_id: int) -> Turn:
        """Append ``context_ids[i]`` to row ``rows[i]`` and sample its next action."""
        rows = list(rows)
        budgets = []
        for r, ids in zip(rows, context_ids, strict=True):
            self.tokens[r].extend(int(t) for t in ids)
            n = len(self.tokens[r])
            if n >= self.max_len:
                raise ValueError(f"row {r}: a conversation of {n} tokens leaves no room")
            budgets.append(min(cfg.max_answer_seq_len, self.max_len - n))
        g = replace(cfg, max_answer_seq_len=max(budgets))
        seeds = torch.cat([turn_seeds(self.row_seeds[r : r + 1], self.turns[r] + 1) for r in rows])
        token_ids = [list(self.tokens[r]) for r in rows]
        if self.reread:
            ids, mask = left_pad(token_ids, pad_id)
            out = sample_responses(self.sampler, ids, mask, g, eos_ids, pad_id, seeds)
        else:
            batch = Conversations(token_ids, rows, [self.seen[r] for r in rows])
            out = sample_turns(self.sampler, batch, g, eos_ids, pad_id, seeds)
        n = [min(int(m.sum()), b) for m, b in zip(out.action_mask, budgets, strict=True)]
        actions = [out.response_ids[i, :k].tolist() for i, k in enumerate(n)]
        for r, a in zip(rows, actions, strict=True):
            self.tokens[r].extend(a)
            self.seen[r] = len(self.tokens[r])
            self.turns[r] += 1

        def cut(x: torch.Tensor | None) -> list[list[float]] | None:
            return None if x is None else [x[i, :k].tolist() for i, k in enumerate(n)]

        return Turn(
            actions,
            [bool(a) and a[-1] in eos_ids for a in actions],
            cut(out.logprobs),
            cut(out.entropy),
        )

    def close(self) -> None:
        self.sampler.end_conversations()
