"""Monte-Carlo values at macro-action boundaries, for ``--advantage_estimator macro_mc``.

At each chosen boundary of a response (:func:`mc_boundaries`, at most ``--mc_max_boundaries`` per
response), the state is prompt ⧺ response[:p]. From it the current
policy (the actor before this step's update) draws ``--mc_rollouts K`` continuations, sampled like
the responses (same temperature, top-k, top-p; the whole response, prefix included, stays within
``--max_answer_seq_len``: a continuation from p may use the remaining ``max_answer_seq_len − p``
tokens). Each continued response is scored with the step's own sequence reward (the reward model's
end score, normalised with ``--normalize_reward``, plus the code / gold reward of
``--reward_source``; clipped, plus the no-EOS penalty: :func:`marlhf.algo.kl_rewards.sequence_rewards`),
and the mean of the K rewards is V̂ at the boundary. With ``--n_samples_per_prompt 1`` the prompt
itself is a boundary too (p = 0: K fresh responses); with G >= 2 its value is the leave-one-out mean
of the group's rewards and costs nothing.

All continuations of a rank (every boundary × K) are drawn in a few large generate calls of
``--mc_generation_batch_size`` rows, sorted by prefix length so that a call's rows have similar
budgets. With ``--generation_backend static`` or ``vllm`` each continuation's noise is seeded from
(``--seed``, step, its key; stream 3, apart from the responses' 2), its key being (global row,
boundary slot, k):
the continuations do not depend on how the batch is split over ranks or into calls, and a resumed run
redraws them. Each rank draws the continuations of its own rows; the values travel with the rows'
experience when it is gathered.

With ``--env`` the boundaries are turn starts and the continuations replay the episode's first
turns on a fresh environment (:mod:`marlhf.stages.ppo.mc_env`).

Cost: a response of n tokens has at most min(C, n / spacing) boundaries (``spaced``; a spacing
shorter than its macro actions chooses a start once), or min(M − 1, C) with M macro actions
(``spread``), so longer macro actions mean fewer boundaries and fewer continuations (logged per step
as ``mc/continuations`` and ``mc/boundaries``, the time as ``time/mc``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from marlhf.algo.estimators import (
    MCBoundaries,
    select_mc_boundaries,
    select_spaced_mc_boundaries,
)
from marlhf.algo.kl_rewards import sequence_rewards
from marlhf.models.sequences import end_index, pack_flush_left
from marlhf.runtime.distributed import all_gather_padded, all_reduce_sum, world_size
from marlhf.runtime.rows import derive_row_seeds
from marlhf.stages.ppo.experience import Experience, segments_of
from marlhf.stages.ppo.rollout import Rollout, generate
from marlhf.stages.ppo.scoring import SequenceReward

if TYPE_CHECKING:
    from marlhf.macro import MacroSegments
    from marlhf.stages.ppo.config import GenerationConfig, PPOConfig
    from marlhf.stages.ppo.models import Models

MC_STREAM = 3  # the seed stream of the continuations (0 segments, 1 dense rewards, 2 responses)


@dataclass
class MCJobs:
    """The continuations to draw (J of them): row ``row[j]``'s state after ``prefix[j]`` response
    tokens, the ``k[j]``-th of its K draws there. ``slot`` 0 is the prompt (``prefix`` 0), slot
    n >= 1 the row's n-th boundary."""

    row: torch.Tensor  # (J,) long  local row
    slot: torch.Tensor  # (J,) long
    k: torch.Tensor  # (J,) long
    prefix: torch.Tensor  # (J,) long  response tokens before the state


def continuation_jobs(boundaries: MCBoundaries, K: int, with_prompt: bool) -> MCJobs:
    """Every (row, slot, k) of ``boundaries`` (B, N) and, if ``with_prompt``, of every row's prompt
    (slot 0), in row-major order.

    >>> import torch
    >>> b = MCBoundaries(torch.tensor([[2, 4], [3, -1]]), torch.tensor([[1, 1], [1, 0]]).bool(),
    ...                  torch.tensor([[1, 2], [1, -1]]))
    >>> jobs = continuation_jobs(b, K=2, with_prompt=False)
    >>> jobs.row.tolist(), jobs.slot.tolist(), jobs.prefix.tolist()
    ([0, 0, 0, 0, 1, 1], [1, 1, 2, 2, 1, 1], [2, 2, 4, 4, 3, 3])
    """
    pos, mask = boundaries.positions, boundaries.mask.bool()
    B = pos.shape[0]
    prompt = torch.full((B, 1), with_prompt, dtype=torch.bool, device=mask.device)
    valid = torch.cat([prompt, mask], 1)  # (B, N + 1): slot 0 the prompt
    positions = torch.cat([torch.zeros(B, 1, dtype=pos.dtype, device=pos.device), pos], 1)
    row, slot = torch.nonzero(valid, as_tuple=True)
    return MCJobs(
        row=row.repeat_interleave(K),
        slot=slot.repeat_interleave(K),
        k=torch.arange(K, device=row.device).repeat(row.numel()),
        prefix=positions[row, slot].repeat_interleave(K),
    )


def job_keys(jobs: MCJobs, global_rows: torch.Tensor, max_boundaries: int, K: int) -> torch.Tensor:
    """(J,) long: a key of each continuation that depends only on its global row, slot and k."""
    g = global_rows.to(jobs.row.device)[jobs.row]
    return (g * (max_boundaries + 1) + jobs.slot) * K + jobs.k


def mc_means(
    rewards: torch.Tensor, jobs: MCJobs, B: int, N: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (B, N), prompt values (B,)): the mean reward of the continuations of each (row, slot)
    (slot n >= 1 → column n − 1, slot 0 → the prompt value); 0 where there are none."""
    flat = jobs.row * (N + 1) + jobs.slot
    sums = rewards.new_zeros(B * (N + 1)).index_add_(0, flat, rewards)
    counts = rewards.new_zeros(B * (N + 1)).index_add_(0, flat, torch.ones_like(rewards))
    means = (sums / counts.clamp(min=1)).view(B, N + 1)
    return means[:, 1:], means[:, 0]


def prefix_batch(ro: Rollout, rows: torch.Tensor, prefix: torch.Tensor, pad_id: int) -> dict:
    """Left-padded prompts ⧺ response[:prefix] of ``rows`` (a generation batch for
    :func:`marlhf.stages.ppo.rollout.generate`)."""
    lengths = ro.response_start[rows] + prefix  # tokens of each state
    W = int(lengths.max())
    T = ro.sequences.shape[1]
    pos = torch.arange(W, device=lengths.device)[None, :] - (W - lengths)[:, None]  # (J, W)
    valid = pos >= 0
    ids = ro.sequences[rows].gather(1, pos.clamp(0, T - 1))
    return {
        "input_ids": ids.masked_fill(~valid, pad_id),
        "attention_mask": valid.long(),
        "prompt_id": [ro.prompt_ids[i] for i in rows.tolist()],
    }


def continued_rollout(
    ro: Rollout, rows: torch.Tensor, prefix: torch.Tensor, cont: Rollout, max_len: int, pad_id: int
) -> Rollout:
    """The whole responses response[:prefix] ⧺ continuation of ``rows`` (the continuation cut to the
    budget ``max_len − prefix``; a row whose EOS falls beyond it did not end), packed like a rollout.

    ``cont``: the continuations generated from :func:`prefix_batch`'s states (its ``response_ids``)."""
    budget = (max_len - prefix)[:, None]
    C = cont.response_ids.shape[1]
    keep = cont.action_mask & (torch.arange(C, device=budget.device)[None, :] < budget)
    ends = cont.ends_with_eos & (cont.action_mask.sum(1) <= budget[:, 0])
    resp = ro.response_ids[rows]
    head = torch.arange(resp.shape[1], device=budget.device)[None, :] < prefix[:, None]
    ids, mask, _ = pack_flush_left(resp, head, cont.response_ids, keep, pad_id)
    T = ro.sequences.shape[1]
    start = ro.response_start[rows]
    prompt_mask = torch.arange(T, device=start.device)[None, :] < start[:, None]
    seq, att, start = pack_flush_left(ro.sequences[rows], prompt_mask, ids, mask, pad_id)
    return Rollout(
        sequences=seq,
        attention_mask=att,
        response_start=start,
        response_ids=ids.masked_fill(~mask, pad_id),
        action_mask=mask,
        ends_with_eos=ends,
        prompt_ids=[ro.prompt_ids[i] for i in rows.tolist()],
    )


@torch.no_grad()
def score_continued(
    reward_model, reward: SequenceReward, full: Rollout, metas: list[dict], texts: list[str]
) -> torch.Tensor:
    """(J,) the sequence reward of each continued response: the step's reward (reward model, code,
    gold), clipped, plus the no-EOS penalty — what the responses' ``outcome`` is. ``reward_model``:
    the reward model's engine (None without one)."""
    ppo = reward.ppo
    rm_scores = None
    if reward_model is not None:
        rm = reward_model(input_ids=full.sequences, attention_mask=full.attention_mask.long())
        rm_scores = rm.gather(1, end_index(full.attention_mask)[:, None]).squeeze(1)
    scores, _ = reward(full, rm_scores, metas, texts)
    return continued_outcome(ppo, scores, full)


def continued_outcome(ppo: PPOConfig, scores: torch.Tensor, full: Rollout) -> torch.Tensor:
    """(J,) the continued responses' sequence rewards from their ``scores`` (J,): clipped
    (``--reward_clip``), plus the no-EOS penalty for a response cut before its end."""
    return sequence_rewards(
        scores,
        full.action_mask,
        reward_clip=ppo.reward_clip if ppo.reward_clip > 0 else None,
        ends_with_eos=full.ends_with_eos,
        no_eos_penalty=ppo.no_eos_penalty,
    )


def _chunks(jobs: MCJobs, size: int, collective: bool) -> list[torch.Tensor | None]:
    """Job indices per generate call, sorted by prefix length; with ``collective`` (ZeRO-3: each
    call gathers the weights over ranks) padded with None to the most calls of any rank."""
    order = torch.sort(jobs.prefix, stable=True).indices
    chunks: list[torch.Tensor | None] = list(order.split(size)) if order.numel() else []
    if collective:
        most = int(all_gather_padded(torch.tensor([len(chunks)])).max())
        chunks += [None] * (most - len(chunks))
    return chunks


@dataclass(frozen=True)
class Continuations:
    """What drawing and scoring a step's continuations reads: the engines, ``--mc_*`` (in the PPO
    part), the responses' sampling settings, the tokenizer and its EOS ids, the sequence reward
    and the step (the continuations' seeds)."""

    models: Models
    ppo: PPOConfig
    g: GenerationConfig
    tokenizer: object
    eos_ids: list[int]
    reward: SequenceReward
    step: int


def continuation_rewards(
    ctx: Continuations,
    ro: Rollout,
    jobs: MCJobs,
    keys: torch.Tensor,
    metas: list[dict],
    texts: list[str],
) -> torch.Tensor:
    """(J,) the sequence reward of every continuation of ``jobs`` (on the CPU), drawn in calls of
    ``--mc_generation_batch_size`` rows (see the module docstring)."""
    models, ppo, g, tokenizer, reward = ctx.models, ctx.ppo, ctx.g, ctx.tokenizer, ctx.reward
    pad = tokenizer.pad_token_id
    size = ppo.mc_generation_batch_size or g.per_device_generation_batch_size * ppo.mc_rollouts
    engines = (models.actor, models.reward)
    zero3 = any(e is not None and e.zero_optimization_stage() == 3 for e in engines)
    device = ro.sequences.device
    out = torch.zeros(jobs.row.numel(), dtype=torch.float64)
    for idx in _chunks(jobs, size, collective=zero3 and world_size() > 1):
        dummy = idx is None  # a call that only keeps this rank in step with the others
        if dummy:  # row 0's prompt
            rows, prefix, key = (torch.zeros(1, dtype=torch.long) for _ in range(3))
        else:
            rows, prefix, key = jobs.row[idx], jobs.prefix[idx], keys[idx]
        rows, prefix = rows.to(device), prefix.to(device)
        seeds = derive_row_seeds(ppo.optim.seed, ctx.step, key, MC_STREAM)  # seeding backends
        call = replace(g, max_answer_seq_len=g.max_answer_seq_len - int(prefix.min()))
        batch = prefix_batch(ro, rows, prefix, pad)
        cont = generate(models.actor, models.sampler, batch, call, tokenizer, ctx.eos_ids, seeds)
        full = continued_rollout(ro, rows, prefix, cont, g.max_answer_seq_len, pad)
        if dummy:
            if models.reward is not None:
                models.reward(input_ids=full.sequences, attention_mask=full.attention_mask.long())
            continue
        r = rows.tolist()
        rewards = score_continued(
            models.reward, reward, full, [metas[i] for i in r], [texts[i] for i in r]
        )
        out[idx] = rewards.double().cpu()
    return out


def mc_boundaries(segments: MacroSegments, ppo: PPOConfig, max_answer_seq_len: int) -> MCBoundaries:
    """The boundaries ``--mc_boundary_selection`` chooses (at most ``--mc_max_boundaries``):
    ``spaced`` every ``--mc_boundary_spacing`` tokens (0: ``max_answer_seq_len / (C + 1)``, rounded
    up; :func:`marlhf.algo.estimators.select_spaced_mc_boundaries`) or ``spread`` evenly over each
    response's macro actions (:func:`marlhf.algo.estimators.select_mc_boundaries`)."""
    C = ppo.mc_max_boundaries
    if ppo.mc_boundary_selection == "spread":
        return select_mc_boundaries(segments, C)
    spacing = ppo.mc_boundary_spacing or -(-max_answer_seq_len // (C + 1))
    return select_spaced_mc_boundaries(segments, C, spacing)


def monte_carlo(
    ctx: Continuations,
    exp: Experience,
    rows: torch.Tensor,
    metas: list[dict],
    texts: list[str],
) -> tuple[Experience, dict[str, float]]:
    """This rank's experience (its own rows, before gathering) with ``macro_mc``'s Monte-Carlo
    values (``mc_positions``, ``mc_values``, ``mc_prompt_values``), and the step's ``mc/*`` metrics
    over all ranks. ``rows``: the rows' global indices; ``metas``/``texts``: their prompts'."""
    ppo, g = ctx.ppo, ctx.g
    K, C = ppo.mc_rollouts, ppo.mc_max_boundaries
    boundaries = mc_boundaries(segments_of(exp), ppo, g.max_answer_seq_len)
    with_prompt = ppo.n_samples_per_prompt == 1
    cpu = MCBoundaries(
        positions=boundaries.positions.cpu(),
        mask=boundaries.mask.cpu(),
        macro_index=boundaries.macro_index.cpu(),
    )
    jobs = continuation_jobs(cpu, K, with_prompt)
    keys = job_keys(jobs, rows.cpu(), C, K)
    rewards = continuation_rewards(ctx, exp.rollout, jobs, keys, metas, texts)
    return with_mc_values(exp, boundaries, jobs, rewards, with_prompt)


def with_mc_values(
    exp: Experience,
    boundaries: MCBoundaries,
    jobs: MCJobs,
    rewards: torch.Tensor,
    with_prompt: bool,
) -> tuple[Experience, dict[str, float]]:
    """``exp`` with the Monte-Carlo values of ``boundaries`` (B, N): the mean of the ``rewards``
    (J,) of each boundary's continuations ``jobs`` (:func:`mc_means`; the prompt's too when
    ``with_prompt``), and the ``mc/*`` metrics over all ranks."""
    B, N = boundaries.positions.shape
    values, prompt_values = mc_means(rewards, jobs, B, N)
    device = exp.outcome.device
    exp = replace(
        exp,
        mc_positions=boundaries.positions,
        mc_values=values.to(device, exp.outcome.dtype),
        mc_prompt_values=prompt_values.to(device, exp.outcome.dtype) if with_prompt else None,
    )
    counts = all_reduce_sum(
        torch.tensor([jobs.row.numel(), int(boundaries.mask.sum()), B], dtype=torch.float64)
    )
    stats = {
        "mc/continuations": float(counts[0]),
        "mc/boundaries": float(counts[1] / counts[2]),
    }
    return exp, stats
