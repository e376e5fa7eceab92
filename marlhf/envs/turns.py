"""The policy of an episode in tokens: :class:`TurnSampler`, the ``act`` of
:func:`marlhf.envs.runner.run_episodes` that samples each turn by a generation backend (PPO's
multi-turn rollouts, ``marlhf infer --env``), and :func:`check_first_prompt`.

Each round, every row still playing gets its next action from the generation backend: its
conversation is kept in tokens as it is played (:class:`marlhf.models.conversation.ChatLayout`: the
first prompt with the chat template, each action's *sampled* tokens, never re-tokenised, and after
it only the new context the template renders, the observations and the next generation prompt),
and the backend samples each row's next action from its tokens
(:func:`marlhf.models.generation.sampling.sample_turns`: a backend that continues conversations,
the static decoder, reads only the new tokens; any other reads the whole conversation again). Row
``b``'s draws at turn ``k`` come from the seed :func:`marlhf.runtime.rows.turn_seeds` derives from
its row seed, so a row plays the same episode in any batch (with a backend that seeds rows).

A row may be given a recorded beginning (``replay``): the (text, token ids) of its first turns as an
earlier episode sampled them, returned turn by turn instead of sampling (the environment is stepped
with the same texts, the conversation holds the same tokens); its later turns are sampled. That is
how ``--advantage_estimator macro_mc`` continues an episode from a turn boundary
(:mod:`marlhf.stages.ppo.mc_env`).

With a ``collective`` backend (``hf`` on a ZeRO-3 partitioned actor over several ranks: each call
all-gathers the weights) every rank must make as many sampling calls, though its rows end at other
turns than the others' (or replay more turns): before each call the ranks agree whether any of
them samples (one all-reduce), and a rank whose episodes have all ended keeps answering with a
call on a one-token placeholder row, its output dropped (:meth:`TurnSampler.keep_in_step`, after
the episodes), until no rank samples any more.

An environment's error under ``--env_errors fail`` stops every rank, not just its own
(:func:`raise_together`): the rank it happened on stops playing, keeps the others in step, and
then every rank learns of it in one all-reduce after the episodes. The rank prints its error line
and every other rank one line naming that rank; none goes on to a collective the failed rank
never joins (where gloo fails with a peer's closed connection and NCCL waits for its timeout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from marlhf.envs.runner import EnvError, Episode
from marlhf.models.conversation import ChatLayout, ConversationTokens, TemplateError
from marlhf.models.generation import Conversations, GenerationBackend, SamplingConfig
from marlhf.models.generation.sampling import sample_turns
from marlhf.runtime.distributed import all_reduce_sum, rank, world_size
from marlhf.runtime.rows import turn_seeds


def env_layout(env: str, tokenizer, whose: str) -> ChatLayout:
    """The chat layout of the policy's ``tokenizer`` for the environment ``--env env``; a
    ValueError naming both when the tokenizer has no chat template (``whose``: the policy's model,
    as the message names it)."""
    try:
        return ChatLayout(tokenizer)
    except TemplateError as err:
        raise ValueError(
            f"--env {env}: {err}; the observations of a conversation are rendered with {whose}'s "
            "chat template (tiny-base-trail carries one)"
        ) from None


def check_first_prompt(layout: ChatLayout, rows: Sequence[dict], max_total: int) -> None:
    """ValueError naming the first row whose first prompt (its messages with the chat template)
    leaves no room for a turn within ``--max_total_seq_len``."""
    for row in rows:
        prompt = row["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        n = len(layout.prompt(messages))
        if n >= max_total:
            raise ValueError(
                f"prompt row {row['prompt_id']}: its first prompt is {n} tokens with the chat "
                f"template; --max_total_seq_len {max_total} leaves no room for a turn"
            )


class TurnSampler:
    """The policy of :func:`~marlhf.envs.runner.run_episodes`: samples the next action of the rows
    still playing, and keeps each row's conversation in tokens as it is played (module doc).

    Args:
        layout: the actor tokenizer's :class:`~marlhf.models.conversation.ChatLayout`.
        sampler: the run's generation backend.
        g: the sampling flags; ``--max_answer_seq_len`` is the most tokens of one turn.
        eos_ids: the tokens that end a turn (the layout's end-of-turn token among them).
        pad_id: the padding token.
        row_seeds: (B,) long, each row's seed (its turns' seeds derive from it).
        max_total: ``--max_total_seq_len``: a turn is cut where the conversation reaches it.
        device: where the backend's prompts go (the actor's device).
        replay: per row, the (text, token ids) of its first turns to play back instead of sampling
            (module doc); None: every turn sampled. Replayed turns record no log-probs
            (``recorded`` is false).
    """

    def __init__(
        self,
        layout: ChatLayout,
        sampler: GenerationBackend,
        g: SamplingConfig,
        eos_ids: list[int],
        pad_id: int,
        row_seeds: torch.Tensor,
        max_total: int,
        device=None,
        replay: Sequence[Sequence[tuple[str, list[int]]]] | None = None,
    ) -> None:
        self.layout, self.sampler, self.g = layout, sampler, g
        self.eos_ids = list(eos_ids)
        if layout.end_of_turn not in self.eos_ids:
            self.eos_ids.append(layout.end_of_turn)
        self.pad_id, self.row_seeds, self.max_total, self.device = (
            pad_id,
            row_seeds,
            max_total,
            device,
        )
        B = len(row_seeds)
        self.convs: list[ConversationTokens | None] = [None] * B
        self.laid = [0] * B  # messages laid out, the last action's aside
        self.rendered: list[list[int]] = [[] for _ in range(B)]  # render(laid messages, True)
        self.seen = [0] * B  # tokens the backend has read or sampled for the row
        self.actions: list[list[tuple[str, list[int]]]] = [[] for _ in range(B)]
        self.logprobs: list[list[float]] = [[] for _ in range(B)]
        self.entropy: list[list[float]] = [[] for _ in range(B)]
        self.recorded = [True, True]  # every call recorded log-probs, entropies
        self.replay = [list(r) for r in replay] if replay is not None else [[] for _ in range(B)]
        if any(self.replay):
            self.recorded = [False, False]

    def _lay_out(self, i: int, messages: list[dict]) -> ConversationTokens:
        """Row ``i``'s conversation in tokens up to ``messages`` (the episode's so far) and its
        next generation prompt: the first prompt, or the context after its last action."""
        conv = self.convs[i]
        if conv is None:
            ids = self.layout.prompt(messages)
            conv = ConversationTokens()
            conv.extend(ids, False, 0)
            conv.prompt_len = len(ids)
            self.convs[i], self.rendered[i], self.laid[i] = conv, ids, len(messages)
            return conv
        n = self.laid[i]
        if len(messages) == n:
            return conv
        text, ids = self.actions[i][-1]
        k = len(self.actions[i])
        ended = bool(ids) and ids[-1] == self.layout.end_of_turn
        piece, self.rendered[i] = self.layout.context_and_render(
            messages[:n], text, messages[n + 1 :], ended, k, self.rendered[i]
        )
        conv.extend(piece, False, k)
        self.laid[i] = len(messages)
        return conv

    def measure(self, i: int, messages: list[dict]) -> int:
        """Tokens of row ``i``'s conversation with its next generation prompt (``measure`` of
        :func:`~marlhf.envs.runner.run_episodes`)."""
        return len(self._lay_out(i, messages).token_ids)

    def __call__(self, row_ids: list[int], conversations: list[list[dict]]) -> list[str]:
        convs = [self._lay_out(i, m) for i, m in zip(row_ids, conversations, strict=True)]
        texts: dict[int, str] = {}
        sampled = []
        for i, conv in zip(row_ids, convs, strict=True):
            k = len(self.actions[i])
            if k < len(self.replay[i]):  # a recorded turn, played back
                text, ids = self.replay[i][k]
                self._add(i, conv, text, list(ids))
                texts[i] = text
            else:
                sampled.append((i, conv))
        if sampled:
            texts.update(self._sample(sampled))
        return [texts[i] for i in row_ids]

    def _add(self, i: int, conv: ConversationTokens, text: str, ids: list[int]) -> None:
        """Row ``i``'s next action ``text`` of tokens ``ids`` into its conversation."""
        conv.extend(ids, True, len(self.actions[i]) + 1)
        conv.turn_ends.append(len(conv.token_ids) - 1)
        self.actions[i].append((text, ids))

    def _sample(self, rows: list[tuple[int, ConversationTokens]]) -> dict[int, str]:
        """The next action of each of ``rows`` (row, its conversation), sampled in one call."""
        row_ids = [i for i, _ in rows]
        token_ids = [list(c.token_ids) for _, c in rows]
        budget = [self.max_total - len(t) for t in token_ids]
        g = self.g
        if max(budget) < g.max_answer_seq_len:  # no row has room for a whole turn
            g = replace(g, max_answer_seq_len=max(budget))
        seeds = torch.cat(
            [turn_seeds(self.row_seeds[i : i + 1], len(self.actions[i]) + 1) for i in row_ids]
        )
        batch = Conversations(token_ids, list(row_ids), [self.seen[i] for i in row_ids])
        if self.sampler.collective:
            self._any_rank_samples(True)
        out = sample_turns(self.sampler, batch, g, self.eos_ids, self.pad_id, seeds, self.device)
        self.recorded = [self.recorded[0] and out.logprobs is not None, self.recorded[1]]
        self.recorded[1] = self.recorded[1] and out.entropy is not None
        texts = {}
        for b, (i, conv) in enumerate(rows):
            n = min(int(out.action_mask[b].sum()), budget[b])  # cut at --max_total_seq_len
            ids = out.response_ids[b, :n].tolist()
            body = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
            text = self.layout.tokenizer.decode(body, skip_special_tokens=True)
            self._add(i, conv, text, ids)
            self.seen[i] = len(conv.token_ids)
            if out.logprobs is not None:
                self.logprobs[i].extend(out.logprobs[b, :n].tolist())
            if out.entropy is not None:
                self.entropy[i].extend(out.entropy[b, :n].tolist())
            texts[i] = text
        return texts

    def _any_rank_samples(self, this_rank: bool) -> bool:
        """Whether any rank makes a sampling call now, ``this_rank`` whether this one does (a
        collective: every rank calls it before each of its calls, and after its episodes)."""
        flag = torch.tensor([1.0 if this_rank else 0.0], device=self.device)
        return bool(all_reduce_sum(flag).item() > 0)

    def keep_in_step(self) -> None:
        """After this rank's episodes, with a ``collective`` backend: a placeholder call (one
        pad token, one new token, its output dropped) for each call another rank still makes,
        until no rank samples (module doc). Nothing with any other backend."""
        if not self.sampler.collective:
            return
        g = replace(self.g, max_answer_seq_len=1)
        placeholder = Conversations([[self.pad_id]], [-1], [0])
        seed = torch.zeros(1, dtype=torch.long)
        while self._any_rank_samples(False):
            sample_turns(self.sampler, placeholder, g, self.eos_ids, self.pad_id, seed, self.device)

    def finished(self, episodes: Sequence[Episode]) -> list[ConversationTokens]:
        """Each row's conversation up to its last action (the observations after it, laid out
        when an episode ended at ``--max_total_seq_len``, dropped: nothing follows them); the
        first prompt alone, without an action, for a row whose environment failed to start
        (``--env_errors zero_reward``)."""
        out = []
        for i, conv in enumerate(self.convs):
            if conv is None:
                conv = self._lay_out(i, episodes[i].messages)
            end = conv.turn_ends[-1] + 1 if conv.turn_ends else conv.prompt_len
            kept = ConversationTokens(
                conv.token_ids[:end], conv.action_mask[:end], conv.turn_index[:end],
                list(conv.turn_ends), conv.prompt_len,
            )  # fmt: skip
            out.append(kept)
        return out


def raise_together(error: EnvError | None, device: torch.device) -> None:
    """After every rank's episodes (a collective; in a single process the sum is local): raise ``error`` on
    this rank when it has one, and on a rank without one an :class:`EnvError` naming the first
    rank that had one. Returns when no rank's environment failed."""
    flags = torch.zeros(world_size(), device=device)
    flags[rank()] = float(error is not None)
    failed = all_reduce_sum(flags).nonzero().flatten().tolist()
    if error is not None:
        raise error
    if failed:
        raise EnvError(
            f"stopped: the environment of rank {failed[0]} failed (that rank's error line says "
            "which environment, row and turn)"
        )
