"""1. Generate, multi-turn (``--env``): the actor plays one episode per prompt row on the run's
environment (:func:`marlhf.envs.runner.run_episodes`), and the finished conversations are laid out
as the :class:`~marlhf.stages.ppo.rollout.Rollout` the scorer reads.

Each round, every row still playing gets its next action from the generation backend
(:class:`marlhf.envs.turns.TurnSampler`, the ``act`` of :func:`~marlhf.envs.runner.run_episodes`):
its conversation is kept in tokens as it is played (:class:`marlhf.models.conversation.ChatLayout`:
the first prompt with the chat template, each action's *sampled* tokens, never re-tokenised, and
after it only the new context the template renders, the observations and the next generation
prompt), and the
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from marlhf.algo.mismatch import mismatch_metrics
from marlhf.data.env_rows import episode_row, trail_gold
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import EnvFactory, load_env
from marlhf.envs.runner import EnvError, Episode, episode_metrics, run_episodes
from marlhf.envs.turns import TurnSampler, env_layout, raise_together
from marlhf.envs.turns import check_first_prompt as check_first_prompt  # the loop reads it here
from marlhf.models.conversation import ChatLayout, ConversationTokens
from marlhf.models.generation import GenerationBackend
from marlhf.models.sequences import pack_flush_left
from marlhf.stages.ppo.prompts import generation_batches
from marlhf.stages.ppo.rollout import Rollout, concat_rollouts, zero3_gather
from marlhf.stages.ppo.scoring import concat_scored, score

if TYPE_CHECKING:
    from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, TrainerSettings
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

    ppo: PPOConfig  # --seed
    generation: GenerationConfig
    trainer: TrainerSettings  # how the trainer scores the rollouts
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
    return EnvRollouts(factory, env_layout(cfg.env, tokenizer, "the actor"), cfg)


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


@dataclass
class Played:
    """The episodes of a rank's rows in a step, in the rollout's row order, and the prompt rows
    they were played from (``macro_mc`` continues them: :mod:`marlhf.stages.ppo.mc_env`)."""

    rows: list[dict]
    episodes: list[Episode]


def run_turns(
    env: EnvRollouts,
    actor,
    sampler: GenerationBackend,
    rows: Sequence[dict],
    turns: TurnSampler,
    g: GenerationConfig,
    names: Sequence[str],
    check: Callable[[list[Episode]], None] | None = None,
) -> list[Episode]:
    """:func:`~marlhf.envs.runner.run_episodes` of ``rows`` with ``turns`` as the policy, the
    ``actor`` in eval mode (its ZeRO-3 weights gathered with ``--enable_zero3_generation_gather``)
    for a backend that samples with it, then the calls that keep this rank in step with the others
    (:meth:`~marlhf.envs.turns.TurnSampler.keep_in_step`) and the all-reduce that stops every rank
    when an environment failed on one (:func:`~marlhf.envs.turns.raise_together`); ``names``: how
    errors name the rows; ``check``: called on this rank's episodes, an :class:`EnvError` it raises
    stops every rank the same way."""
    episode_rows = [episode_row(r) for r in rows]

    def played() -> list[Episode]:
        out, error = [], None
        try:
            out = run_episodes(env.factory, episode_rows, turns, env.cfg, turns.measure, names)
            if check is not None:
                check(out)
        except EnvError as e:  # --env_errors fail: every rank stops (raise_together)
            error = e
        turns.keep_in_step()
        raise_together(error, turns.device)
        return out

    try:
        if sampler.uses_model:
            actor.eval()
            with zero3_gather(actor, g.enable_zero3_generation_gather):
                return played()
        return played()
    finally:
        if sampler.uses_model:
            actor.train()
        sampler.end_conversations()


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
    the run's ``sampler`` on the ``actor`` (:func:`run_turns`): the rollout
    (:func:`conversation_rollout`) and the episodes. ``row_seeds``: (B,) long, each row's seed."""
    turns = TurnSampler(
        env.layout, sampler, g, eos_ids, pad_id, row_seeds, env.cfg.max_total_seq_len,
        actor.device,
    )  # fmt: skip
    names = [f"prompt row {r['prompt_id']}" for r in rows]
    episodes = run_turns(env, actor, sampler, rows, turns, g, names)
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
    concatenated rollout and scores, the rows' metas (empty), their prompt texts, the
    episodes' metrics (:func:`episode_step_metrics`) and the episodes (:class:`Played`)."""
    plan, env, seed = run.plan, run.env, run.ppo.optim.seed
    assert env is not None
    rollouts, scoreds, episodes, played = [], [], [], []
    micro = []
    for idx, seeds, later in generation_batches(plan, seed, step, later_values):
        micro.append(idx)
        rows = [run.prompts[i] for i in idx]
        with clock("time/generate"):
            ro, eps = play(
                env, run.models.actor, run.models.sampler, rows, run.generation, run.eos_ids,
                run.tokenizer.pad_token_id, seeds,
            )  # fmt: skip
        with clock("time/score"):
            scoreds.append(
                score(run.models, ro, run.trainer, run.need_entropy, later, check_rollout)
            )
        rollouts.append(ro)
        episodes.extend(eps)
        played.extend(rows)
    prompt_texts = [run.prompts[i]["prompt_text"] for idx in micro for i in idx]
    ro = concat_rollouts(rollouts, run.tokenizer.pad_token_id)
    scored = concat_scored(scoreds, ro.sequences.shape[1], ro.response_ids.shape[1])
    metrics = episode_step_metrics(env, episodes, played)
    return ro, scored, [{} for _ in prompt_texts], prompt_texts, metrics, Played(played, episodes)


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
