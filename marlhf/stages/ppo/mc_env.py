"""Monte-Carlo values at turn boundaries, for ``--advantage_estimator macro_mc`` with ``--env``
(the single-turn continuations: :mod:`marlhf.stages.ppo.mc`).

Boundaries. In a multi-turn rollout the states ``macro_mc`` continues from are the starts of the
policy's turns: the boundary after k >= 1 turns is the conversation up to turn k's observations
and the next generation prompt, before the first action token of turn k + 1. They are chosen
among a row's turn starts as for macro actions, the turns in their place
(:func:`marlhf.stages.ppo.mc.mc_boundaries`, at most ``--mc_max_boundaries``): ``spread`` evenly
over the episode's turns, ``spaced`` the first turn start at or after every
``--mc_boundary_spacing`` action tokens (0: the episode's action budget, min(``--max_turns`` ×
``--max_answer_seq_len``, ``--max_total_seq_len``), over C + 1, rounded up). With
``--n_samples_per_prompt 1`` the first prompt is a boundary too (k = 0: K fresh episodes); with
G >= 2 its value is the leave-one-out mean of the group's returns.

Continuations, by re-running the environment's steps. Each of the K (``--mc_rollouts``)
continuations from the boundary after k turns of a row is an episode on a fresh environment of
the row (the same prompt, ``--env_config`` and extras) whose first k turns replay the recorded
ones: ``init`` and the recorded actions again, their texts to the environment and their sampled
tokens to the conversation (:class:`marlhf.envs.turns.TurnSampler` with ``replay``), each re-run
step checked against the episode's observations, reward and done (:mod:`marlhf.envs.replay`: an
environment that answers otherwise is not deterministic and the run stops with one ``error:``
line naming it, the row and the turn). Its later turns are sampled by the current policy as the
episodes' are (the same backend and sampling flags, ``--max_answer_seq_len`` per turn) until done,
``--max_turns`` or ``--max_total_seq_len``, each continuation's draws from the seed of
(``--seed``, step, its key; stream 3, the episodes' being stream 2), the key being (global row,
boundary slot, k) as in :mod:`marlhf.stages.ppo.mc`.

Return. V̂ at a boundary is the mean return of its K continuations (:func:`episode_returns`).
``macro_mc`` takes the per-turn rewards into the outcome (``turn_rewards = "outcome"``,
:func:`marlhf.algo.estimators.with_turn_rewards`): the value at the end of an episode is its
sequence reward (the reward model's score of the conversation with ``--reward_source rm``,
normalised, clipped, plus the no-EOS penalty; without it 0 plus the penalty) plus the sum of all
its turns' rewards, and the prompt's value (G >= 2) the group's mean of those. A continuation's
return is the same of the continued episode: the replayed turns' rewards (the recorded ones,
checked), the rewards of the turns from the boundary on and the sequence reward of the whole
conversation. The replayed rewards are the same in every continuation of a boundary, so a credit
segment's advantage V̂(b_{j+1}) − V̂(b_j) is the difference of the expected rewards-to-go plus
the rewards of the segment's own turns, each turn's reward counted once.

Cost. A rank's continuations are played in batches of ``--mc_generation_batch_size`` episodes
(0: ``--per_device_generation_batch_size`` × ``--mc_rollouts``), each batch one
:func:`marlhf.envs.runner.run_episodes`: every round steps its environments in parallel and
samples the actions of the episodes past their replayed turns in one call of the generation
backend; replaying costs environment steps, no generation. Logged as ``mc/continuations``,
``mc/boundaries`` and ``time/mc``. Over several ranks every rank plays as many batches (a rank
with fewer plays placeholder episodes of its first row, their returns dropped): each batch ends
in a collective.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING

import torch

from marlhf.algo.estimators import MCBoundaries
from marlhf.envs.replay import check_replay
from marlhf.envs.turns import TurnSampler
from marlhf.macro import build_segments
from marlhf.runtime.distributed import all_gather_padded, world_size
from marlhf.runtime.rows import derive_row_seeds
from marlhf.stages.ppo.mc import (
    MC_STREAM,
    Continuations,
    MCJobs,
    continuation_jobs,
    continued_outcome,
    job_keys,
    mc_boundaries,
    score_continued,
    with_mc_values,
)
from marlhf.stages.ppo.multiturn import conversation_rollout, run_turns

if TYPE_CHECKING:
    from marlhf.envs.config import EnvConfig
    from marlhf.envs.runner import Episode
    from marlhf.stages.ppo.config import PPOConfig
    from marlhf.stages.ppo.experience import Experience
    from marlhf.stages.ppo.multiturn import EnvRollouts, Played
    from marlhf.stages.ppo.rollout import Rollout


def action_budget(cfg: EnvConfig, max_answer_seq_len: int) -> int:
    """The most action tokens of an episode: min(``--max_turns`` × ``--max_answer_seq_len``,
    ``--max_total_seq_len``)."""
    return min(cfg.max_turns * max_answer_seq_len, cfg.max_total_seq_len)


def turn_boundaries(ro: Rollout, ppo: PPOConfig, budget: int) -> MCBoundaries:
    """The chosen turn starts of each row of the multi-turn rollout ``ro`` (module doc), (B, N):
    :func:`marlhf.stages.ppo.mc.mc_boundaries` with each turn one macro action; ``budget``: the
    episode's action budget (:func:`action_budget`)."""
    mask = ro.action_mask.bool()
    return mc_boundaries(build_segments(ro.turn_end.bool() & mask, mask), ppo, budget)


def turns_before(ro: Rollout, jobs: MCJobs) -> torch.Tensor:
    """(J,) long: how many turns come before each job's state (0 at the prompt)."""
    index = ro.turn_index.cpu()[jobs.row, jobs.prefix.clamp(min=0)]
    return torch.where(jobs.prefix > 0, index - 1, 0)


def recorded_turns(ro: Rollout, b: int, episode: Episode) -> list[tuple[str, list[int]]]:
    """Row ``b``'s turns as its episode played them: each action's text (what the environment
    was given) and its sampled tokens (``ro``'s actions of that turn)."""
    n = int(ro.action_mask[b].sum())
    tokens: list[list[int]] = [[] for _ in episode.turns]
    for t, k in zip(ro.response_ids[b, :n].tolist(), ro.turn_index[b, :n].tolist(), strict=True):
        tokens[k - 1].append(t)
    return [(t.action, ids) for t, ids in zip(episode.turns, tokens, strict=True)]


@torch.no_grad()
def play_continuations(
    ctx: Continuations,
    env: EnvRollouts,
    played: Played,
    ro: Rollout,
    rows: list[int],
    turns: list[int],
    keys: torch.Tensor,
) -> tuple[Rollout, list[Episode]]:
    """The continued episodes of the states (``rows[j]``, after ``turns[j]`` turns), one each,
    played in one batch (module doc): their conversations laid out
    (:func:`marlhf.stages.ppo.multiturn.conversation_rollout`) and the episodes. ``played``: the
    rank's episodes (row ``b`` of ``ro``); ``keys``: (J,) long, each continuation's key.
    :class:`marlhf.envs.replay.ReplayError` when a replayed turn differs from the recorded (and on
    every other rank an error naming this one: :func:`marlhf.envs.turns.raise_together`)."""
    models, g = ctx.models, ctx.g
    recorded = {b: recorded_turns(ro, b, played.episodes[b]) for b in set(rows)}
    seeds = derive_row_seeds(ctx.ppo.optim.seed, ctx.step, keys, MC_STREAM)
    pad = ctx.tokenizer.pad_token_id
    sampler = TurnSampler(
        env.layout, models.sampler, g, ctx.eos_ids, pad, seeds, env.cfg.max_total_seq_len,
        models.actor.device, replay=[recorded[b][:k] for b, k in zip(rows, turns, strict=True)],
    )  # fmt: skip
    prompt_rows = [played.rows[b] for b in rows]
    ids = [str(r["prompt_id"]) for r in prompt_rows]
    names = [
        f"prompt row {i} (a macro_mc continuation after turn {k})"
        for i, k in zip(ids, turns, strict=True)
    ]

    def replayed_as_recorded(episodes: list[Episode]) -> None:
        for b, k, i, ep in zip(rows, turns, ids, episodes, strict=True):
            if k > 0:
                check_replay(env.cfg.env, f"prompt row {i}", played.episodes[b], ep, k)

    episodes = run_turns(
        env, models.actor, models.sampler, prompt_rows, sampler, g, names, replayed_as_recorded
    )
    full = conversation_rollout(sampler.finished(episodes), episodes, pad, sampler.eos_ids, ids)
    return full, episodes


def _on(ro: Rollout, device) -> Rollout:
    """``ro`` with its tensors on ``device``."""
    moved = {
        f.name: getattr(ro, f.name).to(device)
        for f in fields(ro)
        if isinstance(getattr(ro, f.name), torch.Tensor)
    }
    return replace(ro, **moved)


@torch.no_grad()
def episode_returns(ctx: Continuations, full: Rollout, prompt_texts: list[str]) -> torch.Tensor:
    """(J,) float64 on the CPU: the return of each laid-out episode ``full`` as ``macro_mc``
    compares it (module doc): its sequence reward (the reward model's score of the conversation,
    as the step's :func:`marlhf.stages.ppo.multiturn.env_scores`, clipped, plus the no-EOS
    penalty) plus the sum of its turns' rewards."""
    J = full.sequences.shape[0]
    if ctx.models.reward is not None:
        full = _on(full, ctx.models.actor.device)
        outcome = score_continued(ctx.models.reward, ctx.reward, full, [{}] * J, prompt_texts)
    else:
        outcome = continued_outcome(ctx.ppo, torch.zeros(J), full)
    turn_rewards = torch.where(full.action_mask.bool(), full.turn_rewards, 0.0)
    return outcome.double().cpu() + turn_rewards.double().sum(1).cpu()


def env_monte_carlo(
    ctx: Continuations,
    env: EnvRollouts,
    exp: Experience,
    rows: torch.Tensor,
    played: Played,
) -> tuple[Experience, dict[str, float]]:
    """This rank's experience of multi-turn episodes (its own rows, before gathering) with
    ``macro_mc``'s Monte-Carlo values at turn boundaries (module doc), and the step's ``mc/*``
    metrics over all ranks. ``rows``: the rows' global indices; ``played``: their episodes."""
    ppo, g = ctx.ppo, ctx.g
    K, C = ppo.mc_rollouts, ppo.mc_max_boundaries
    ro = exp.rollout
    boundaries = turn_boundaries(ro, ppo, action_budget(env.cfg, g.max_answer_seq_len))
    with_prompt = ppo.n_samples_per_prompt == 1
    cpu = MCBoundaries(*(x.cpu() for x in (boundaries.positions, boundaries.mask,
                                            boundaries.macro_index)))  # fmt: skip
    jobs = continuation_jobs(cpu, K, with_prompt)
    keys = job_keys(jobs, rows.cpu(), C, K)
    before = turns_before(ro, jobs)
    returns = torch.zeros(jobs.row.numel(), dtype=torch.float64)
    for idx in _batches(ctx, before):
        dummy = idx is None  # a batch that only keeps this rank in step with the others
        if dummy:  # row 0's prompt
            r, k, key = [0], [0], torch.zeros(1, dtype=torch.long)
        else:
            r, k, key = jobs.row[idx].tolist(), before[idx].tolist(), keys[idx]
        full, _ = play_continuations(ctx, env, played, ro, r, k, key)
        value = episode_returns(ctx, full, [played.rows[b]["prompt_text"] for b in r])
        if not dummy:
            returns[idx] = value
    return with_mc_values(exp, boundaries, jobs, returns, with_prompt)


def _batches(ctx: Continuations, before: torch.Tensor) -> list[torch.Tensor | None]:
    """Job indices per batch of continuations, sorted by the turns they replay (a batch's
    episodes replay alike); over several ranks padded with None to the most batches of any rank,
    since every batch ends in a collective (:func:`marlhf.envs.turns.raise_together`: an
    environment's error on one rank stops all), and under ZeRO-3 each gathers the weights and the
    reward model's forward pass is collective, as the single-turn continuations' calls are."""
    ppo = ctx.ppo
    size = ppo.mc_generation_batch_size or ctx.g.per_device_generation_batch_size * ppo.mc_rollouts
    order = torch.sort(before, stable=True).indices
    batches: list[torch.Tensor | None] = list(order.split(size)) if order.numel() else []
    if world_size() > 1:
        most = int(all_gather_padded(torch.tensor([len(batches)])).max())
        batches += [None] * (most - len(batches))
    return batches
