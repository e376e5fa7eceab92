"""1. Generate, multi-turn (``--env``): the actor plays one episode per prompt row on the run's
environment (:func:`marlhf.envs.runner.run_episodes`), and the finished conversations are laid out
as the :class:`~marlhf.stages.ppo.rollout.Rollout` the scorer reads.

Each round, every row still playing gets its next action from the generation backend
(:class:`TurnSampler`, the ``act`` of :func:`~marlhf.envs.runner.run_episodes`): its conversation
is kept in tokens as it is played (:class:`marlhf.models.conversation.ChatLayout`: the first prompt
with the chat template, each action's *sampled* tokens, never re-tokenised, and after it only the
new context the template renders, the observations and the next generation prompt), and the
backend samples each row's next action from its tokens
(:func:`marlhf.models.generation.sampling.sample_turns`: a backend that continues conversations
reads only the new tokens; any other reads the whole conversation again). A row that has ended
waits; it is not stepped again. Row ``b``'s draws at turn ``k`` come from the seed of (``--seed``,
step, its global row, turn ``k``) (:func:`marlhf.runtime.rows.turn_seeds`), so a row plays the same
episode in any batch, and a resumed run replays it.

The layout (:func:`conversation_rollout`): ``sequences`` hold each whole conversation, and the
``(B, A)`` tensors the actions only, compacted (the module doc of
:mod:`marlhf.stages.ppo.rollout`): termination rules, rewards, estimators, losses and metrics run
unchanged on the actions, each turn's end is a macro-action boundary (``turn_end``), the
environment's reward of each turn sits on its last action token (``turn_rewards``), and the
forward passes read each action's log-prob and the critic's value where the action sits in the
conversation. The reward model, with ``--reward_source rm``, scores the whole conversation at its
last token (the last action's: the last turn's observations are not laid out, nothing follows
them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from marlhf.algo.mismatch import mismatch_metrics
from marlhf.data.env_rows import episode_row, trail_gold
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import EnvFactory, load_env
from marlhf.envs.runner import Episode, episode_metrics, run_episodes
from marlhf.models.conversation import ChatLayout, ConversationTokens, TemplateError
from marlhf.models.generation import Conversations, GenerationBackend
from marlhf.models.generation.sampling import sample_turns
from marlhf.models.sequences import pack_flush_left
from marlhf.runtime.distributed import rank
from marlhf.runtime.rows import derive_row_seeds, global_rows, turn_seeds
from marlhf.stages.ppo.prompts import step_prompts
from marlhf.stages.ppo.rollout import Rollout, concat_rollouts, zero3_gather
from marlhf.stages.ppo.scoring import concat_scored, score

if TYPE_CHECKING:
    from marlhf.stages.ppo.config import GenerationConfig, PPOStageConfig
    from marlhf.stages.ppo.models import Models
    from marlhf.stages.ppo.prompts import RolloutPlan
    from marlhf.stages.ppo.scoring import SequenceReward

log = logging.getLogger("marlhf.ppo")


@dataclass(frozen=True)
class EnvRollouts:
    """What the multi-turn rollouts of a run read, built once (:func:`env_setup`): the
    environment's factory, the chat layout of the actor's tokenizer and the ``--env`` flags."""

    factory: EnvFactory
    layout: ChatLayout
    cfg: EnvConfig


class Run(Protocol):
    """What a multi-turn step reads of the PPO loop's run (:class:`marlhf.stages.ppo.loop.Run`)."""

    cfg: PPOStageConfig
    plan: RolloutPlan
    prompts: Any  # the tokenised PPO prompts (a datasets.Dataset)
    tokenizer: Any
    models: Models
    need_entropy: bool  # a rule reads the reference's entropies
    eos_ids: list[int]
    reward: SequenceReward
    env: EnvRollouts | None


def env_setup(cfg: EnvConfig, tokenizer) -> EnvRollouts:
    """The environment of ``--env`` (ValueError naming it when it cannot be found) and the chat
    layout of ``tokenizer`` (ValueError when it has no chat template)."""
    factory = load_env(cfg.env, cfg.env_config)
    try:
        layout = ChatLayout(tokenizer)
    except TemplateError as err:
        raise ValueError(
            f"--env {cfg.env}: {err}; the observations of a conversation are rendered with the "
            "actor's chat template (tiny-base-trail carries one)"
        ) from None
    return EnvRollouts(factory, layout, cfg)


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
    """

    def __init__(
        self,
        layout: ChatLayout,
        sampler: GenerationBackend,
        g: GenerationConfig,
        eos_ids: list[int],
        pad_id: int,
        row_seeds: torch.Tensor,
        max_total: int,
        device=None,
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
        token_ids = [list(c.token_ids) for c in convs]
        budget = [self.max_total - len(t) for t in token_ids]
        g = self.g
        if max(budget) < g.max_answer_seq_len:  # no row has room for a whole turn
            g = replace(g, max_answer_seq_len=max(budget))
        seeds = torch.cat(
            [turn_seeds(self.row_seeds[i : i + 1], len(self.actions[i]) + 1) for i in row_ids]
        )
        batch = Conversations(token_ids, list(row_ids), [self.seen[i] for i in row_ids])
        out = sample_turns(self.sampler, batch, g, self.eos_ids, self.pad_id, seeds, self.device)
        self.recorded = [self.recorded[0] and out.logprobs is not None, self.recorded[1]]
        self.recorded[1] = self.recorded[1] and out.entropy is not None
        texts = []
        for b, (i, conv) in enumerate(zip(row_ids, convs, strict=True)):
            n = min(int(out.action_mask[b].sum()), budget[b])  # cut at --max_total_seq_len
            ids = out.response_ids[b, :n].tolist()
            body = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
            text = self.layout.tokenizer.decode(body, skip_special_tokens=True)
            k = len(self.actions[i]) + 1
            conv.extend(ids, True, k)
            conv.turn_ends.append(len(conv.token_ids) - 1)
            self.actions[i].append((text, ids))
            self.seen[i] = len(conv.token_ids)
            if out.logprobs is not None:
                self.logprobs[i].extend(out.logprobs[b, :n].tolist())
            if out.entropy is not None:
                self.entropy[i].extend(out.entropy[b, :n].tolist())
            texts.append(text)
        return texts

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


def conversation_rollout(
    convs: Sequence[ConversationTokens],
    episodes: Sequence[Episode],
    pad_id: int,
    eos_ids: Sequence[int],
    prompt_ids: list[str],
    logprobs: Sequence[Sequence[float]] | None = None,
    entropy: Sequence[Sequence[float]] | None = None,
) -> Rollout:
    """The :class:`~marlhf.stages.ppo.rollout.Rollout` of finished conversations (module doc):
    ``sequences`` the whole conversations flush-left; ``response_ids``, ``action_mask`` the
    actions compacted (A: the most actions of a row, at least 1); ``action_positions`` where each
    sits after the first prompt; ``turn_end``, ``turn_index``; ``turn_rewards`` each turn's reward
    of ``episodes`` (0 for None) on its last action token; ``ends_with_eos``: the last action ended
    with a token of ``eos_ids``; ``logprobs``, ``entropy``: each row's recorded values of its
    actions in order (None: not recorded)."""
    B = len(convs)
    P = max(c.prompt_len for c in convs)
    R = max(max(len(c.token_ids) - c.prompt_len for c in convs), 1)
    A = max(max(sum(c.action_mask) for c in convs), 1)
    prompt = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.bool)
    response = torch.full((B, R), pad_id, dtype=torch.long)
    response_mask = torch.zeros(B, R, dtype=torch.bool)
    actions = torch.full((B, A), pad_id, dtype=torch.long)
    mask = torch.zeros(B, A, dtype=torch.bool)
    positions = torch.zeros(B, A, dtype=torch.long)
    turn_end = torch.zeros(B, A, dtype=torch.bool)
    turn_index = torch.zeros(B, A, dtype=torch.long)
    turn_rewards = torch.zeros(B, A)
    ends = torch.zeros(B, dtype=torch.bool)
    for b, (c, ep) in enumerate(zip(convs, episodes, strict=True)):
        p = c.prompt_len
        rest = c.token_ids[p:]
        prompt[b, P - p :] = torch.tensor(c.token_ids[:p], dtype=torch.long)
        prompt_mask[b, P - p :] = True
        response[b, : len(rest)] = torch.tensor(rest, dtype=torch.long)
        response_mask[b, : len(rest)] = True
        where = [j for j, a in enumerate(c.action_mask[p:]) if a]
        n = len(where)
        if n == 0:
            continue
        positions[b, :n] = torch.tensor(where, dtype=torch.long)
        actions[b, :n] = response[b, positions[b, :n]]
        mask[b, :n] = True
        turn_index[b, :n] = torch.tensor([c.turn_index[p + j] for j in where], dtype=torch.long)
        compact = {j: k for k, j in enumerate(where)}  # response position -> action index
        for k, t in enumerate(c.turn_ends):
            turn_end[b, compact[t - p]] = True
            reward = ep.turns[k].reward if k < len(ep.turns) else None
            turn_rewards[b, compact[t - p]] = 0.0 if reward is None else float(reward)
        ends[b] = int(actions[b, n - 1]) in eos_ids
    seq, att, start = pack_flush_left(prompt, prompt_mask, response, response_mask, pad_id)

    def recorded(values) -> torch.Tensor | None:
        if values is None:
            return None
        out = torch.zeros(B, A)
        for b, v in enumerate(values):
            out[b, : len(v)] = torch.tensor(list(v), dtype=torch.float32)
        return out

    return Rollout(
        sequences=seq,
        attention_mask=att,
        response_start=start,
        response_ids=actions,
        action_mask=mask,
        ends_with_eos=ends,
        prompt_ids=list(prompt_ids),
        logprobs=recorded(logprobs),
        entropy=recorded(entropy),
        action_positions=positions,
        turn_end=turn_end,
        turn_index=turn_index,
        turn_rewards=turn_rewards,
    )


@torch.no_grad()
def play(
    env: EnvRollouts,
    actor,
    sampler: GenerationBackend,
    rows: Sequence[dict],
    g: GenerationConfig,
    eos_ids: list[int],
    pad_id: int,
    row_seeds: torch.Tensor,
) -> tuple[Rollout, list[Episode]]:
    """One episode per prompt row (loaded by :func:`marlhf.data.env_rows.load_env_rows`) played by
    the run's ``sampler`` on the ``actor`` (in eval mode, its ZeRO-3 weights gathered with
    ``--enable_zero3_generation_gather``, for a backend that samples with it): the rollout
    (:func:`conversation_rollout`) and the episodes. ``row_seeds``: (B,) long, each row's seed."""
    turns = TurnSampler(
        env.layout, sampler, g, eos_ids, pad_id, row_seeds, env.cfg.max_total_seq_len,
        actor.device,
    )  # fmt: skip
    names = [f"prompt row {r['prompt_id']}" for r in rows]
    episode_rows = [episode_row(r) for r in rows]
    try:
        if sampler.uses_model:
            actor.eval()
            with zero3_gather(actor, g.enable_zero3_generation_gather):
                episodes = run_episodes(
                    env.factory, episode_rows, turns, env.cfg, turns.measure, names
                )
        else:
            episodes = run_episodes(env.factory, episode_rows, turns, env.cfg, turns.measure, names)
    finally:
        if sampler.uses_model:
            actor.train()
        sampler.end_conversations()
    lp = turns.logprobs if turns.recorded[0] else None
    ent = turns.entropy if turns.recorded[0] and turns.recorded[1] else None
    ro = conversation_rollout(
        turns.finished(episodes),
        episodes,
        pad_id,
        turns.eos_ids,
        [r["prompt_id"] for r in rows],
        lp,
        ent,
    )
    return ro, episodes


def collect_episodes(
    run: Run,
    step: int,
    clock,
    later_values: torch.Tensor | None = None,
    check_rollout: bool = False,
):
    """1.–2. of a multi-turn step (:func:`marlhf.stages.ppo.loop.collect_rollouts` for ``--env``):
    this rank's episodes of step ``step`` in ``--generation_batches`` batches, each played
    (:func:`play`, row seeds of stream 2 as the single-turn rollouts') then scored. Returns the
    concatenated rollout and scores, the rows' metas (empty), their prompt texts and the
    episodes' metrics (:func:`episode_step_metrics`)."""
    cfg, plan, env = run.cfg, run.plan, run.env
    assert env is not None
    rollouts, scoreds, episodes, played = [], [], [], []
    gen_bs = plan.generation_batch
    gen_rows = global_rows(plan.rollout_size, gen_bs, rank(), plan.world)
    micro = step_prompts(plan, cfg.ppo.optim.seed, step)
    offset = 0
    for j, idx in enumerate(micro):
        rows = [run.prompts[i] for i in idx]
        rows_j = gen_rows[j * gen_bs : j * gen_bs + len(idx)]
        seeds = derive_row_seeds(cfg.ppo.optim.seed, step, rows_j, stream=2)
        with clock("time/generate"):
            ro, eps = play(
                env, run.models.actor, run.models.sampler, rows, cfg.generation, run.eos_ids,
                run.tokenizer.pad_token_id, seeds,
            )  # fmt: skip
        later = None
        if later_values is not None:
            inside = (later_values >= offset) & (later_values < offset + len(idx))
            later = later_values[inside] - offset
        offset += len(idx)
        with clock("time/score"):
            scoreds.append(score(run.models, ro, cfg, run.need_entropy, later, check_rollout))
        rollouts.append(ro)
        episodes.extend(eps)
        played.extend(rows)
    prompt_texts = [run.prompts[i]["prompt_text"] for idx in micro for i in idx]
    ro = concat_rollouts(rollouts, run.tokenizer.pad_token_id)
    scored = concat_scored(scoreds, ro.sequences.shape[1], ro.response_ids.shape[1])
    metrics = episode_step_metrics(env, episodes, played)
    return ro, scored, [{} for _ in prompt_texts], prompt_texts, metrics


def env_scores(run: Run, ro: Rollout, scored, metas, prompt_texts):
    """The sequence-level reward of each conversation, (B,), and its metrics: the reward model's
    score with ``--reward_source rm`` (the run's reward), else 0 (the environment's rewards come
    per turn, :attr:`Rollout.turn_rewards`)."""
    if scored.rm_scores is None:
        return torch.zeros(ro.sequences.shape[0], device=ro.sequences.device), {}
    return run.reward(ro, scored.rm_scores, metas, prompt_texts)


def episode_step_metrics(
    env: EnvRollouts, episodes: Sequence[Episode], rows: Sequence[dict]
) -> dict[str, float]:
    """A step's ``env/*`` metrics (:func:`marlhf.envs.runner.episode_metrics`) and, for the
    bundled trail task, ``objective/gold`` (the share of conversations whose answer names the
    holder)."""
    out = episode_metrics(episodes, env.factory)
    golds = [trail_gold(r, e.messages) for r, e in zip(rows, episodes, strict=True)]
    if golds and all(x is not None for x in golds):
        out["objective/gold"] = sum(golds) / len(golds)
    return out


def turn_mismatch_metrics(
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    turn_index: torch.Tensor,
) -> dict[str, float]:
    """``rollout/ratio_{min,max}_turn``: the rollout–trainer ratio of each turn (the product of its
    tokens' ratios, :func:`marlhf.algo.mismatch.mismatch_metrics` with the turns as segments)."""
    out = mismatch_metrics(trainer_logprobs, rollout_logprobs, action_mask, turn_index - 1)
    return {f"rollout/ratio_{m}_turn": out[f"rollout/ratio_{m}_macro"] for m in ("min", "max")}
