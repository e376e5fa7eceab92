"""5. The PPO update: ``--ppo_epochs`` passes of minibatches over one experience batch; per
minibatch the actor takes a clipped-policy step, then the critic (if the estimator has one) a
clipped-value step.

The experience is the global batch (:func:`marlhf.stages.ppo.experience.gather_experience`) and the shuffle
generator is in the same state on every rank, so all ranks draw one shuffle: minibatch ``i`` is rows
``order[i·M:(i+1)·M]`` with ``M = --per_device_training_batch_size × world``, of which rank ``r``
trains on the ``r``-th slice. Every mean (losses and stats) is divided by the count over the whole
minibatch, and the losses are multiplied by the world size because DeepSpeed averages gradients over
ranks: the update is the one process's with the global minibatch, whatever the split.

On one rank the first minibatch's critic pass is the scoring pass of its rows (same weights): the
loop runs it once, with grad, while scoring (:func:`first_minibatch_rows` reads the shuffle ahead,
:class:`KeptValues` carries the pass), and that minibatch's critic step comes first and uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from marlhf.algo.kl_rewards import kl_penalty
from marlhf.algo.losses import agg_loss, entropy_bonus, policy_loss, policy_terms, value_loss
from marlhf.algo.mismatch import importance_weights
from marlhf.models.lm_loss import causal_lm_loss_sum
from marlhf.models.packing import packing_mode
from marlhf.runtime.distributed import all_reduce_sum, rank, world_size
from marlhf.runtime.finite import guarded_step
from marlhf.runtime.micro_batches import accumulation_boundary, split_rows
from marlhf.stages.ppo.experience import Experience
from marlhf.stages.ppo.forward import KeptValues, critic_forward, policy_forward
from marlhf.stages.ppo.rollout import Rollout, sequence_lengths, slice_rollout

if TYPE_CHECKING:
    from marlhf.stages.ppo.config import PPOConfig, PPOStageConfig
    from marlhf.stages.ppo.models import Models


@dataclass
class Minibatch:
    """This rank's part of one global minibatch, and the counts over the whole minibatch."""

    idx: torch.Tensor  # (mb,) long  this rank's rows of the experience
    rollout: Rollout  # those rows, cut to their longest sequence and response (A' actions)
    num_tokens: torch.Tensor  # 0-d  valid tokens over the global minibatch (>= 1)
    num_terms: torch.Tensor  # 0-d  policy-loss terms (tokens or macro actions) over it (>= 1)
    world: int  # the losses' gradient factor (DeepSpeed averages over ranks)
    num_seqs: torch.Tensor | None = None  # 0-d  non-empty responses over it (>= 1; seq-mean-*)

    def cut(self, x: torch.Tensor) -> torch.Tensor:
        """An experience field (B, A) -> this minibatch's rows and actions (mb, A')."""
        return x[self.idx, : self.rollout.response_ids.shape[1]]


def _epoch_order(B: int, generator: torch.Generator) -> torch.Tensor:
    """One epoch's shuffle of the global batch's B rows: (B,) long."""
    return torch.randperm(B, generator=generator)


def first_minibatch_rows(B: int, ppo: PPOConfig, generator: torch.Generator) -> torch.Tensor:
    """This rank's rows of the update's first minibatch over a global batch of ``B`` rows, read
    from a copy of ``generator`` (its state is left as it is): (mb,) long, the ``idx`` of the first
    :class:`Minibatch` that :func:`minibatches` will yield."""
    peek = torch.Generator(device=generator.device)
    peek.set_state(generator.get_state())
    mb, r = ppo.per_device_training_batch_size, rank()
    return _epoch_order(B, peek)[r * mb : (r + 1) * mb]


def minibatches(exp: Experience, ppo: PPOConfig, generator: torch.Generator):
    """``--ppo_epochs`` shuffles of the global batch, cut into global minibatches; yields this
    rank's :class:`Minibatch` of each."""
    ws, r = world_size(), rank()
    B = exp.rollout.sequences.shape[0]
    mb = ppo.per_device_training_batch_size
    M = mb * ws
    for _ in range(ppo.ppo_epochs):
        order = _epoch_order(B, generator)
        for s in range(0, B - M + 1, M):
            rows = order[s : s + M]  # the global minibatch
            idx = rows[r * mb : (r + 1) * mb]  # this rank's part of it
            # the minibatch's counts over all ranks (every rank holds every row)
            whole = exp.rollout.action_mask[rows]
            n_tokens = whole.sum().clamp(min=1)
            terms = policy_terms(whole, ppo.ratio_level, exp.segment_ids[rows])
            if exp.credit is not None:  # --macro_credit boundary: the boundary tokens only
                terms = terms & exp.credit[rows]
            n_terms = terms.sum().clamp(min=1)
            n_seqs = terms.any(1).sum().clamp(min=1)
            yield Minibatch(
                idx=idx,
                rollout=slice_rollout(exp.rollout, idx),
                num_tokens=n_tokens,
                num_terms=n_terms,
                world=ws,
                num_seqs=n_seqs,
            )


def unsup_loss(actor, batches: Iterator[dict], packing: bool = False) -> torch.Tensor:
    """The SFT LM loss of this rank's next pretraining-mix batch, divided by the SFT tokens of all
    ranks' batches (like the PPO terms); packed with ``packing`` where the actor packs exactly."""
    sft = {k: v.to(actor.device) for k, v in next(batches).items()}
    nll, count = causal_lm_loss_sum(
        actor, sft["input_ids"], sft["attention_mask"], sft["labels"], packing=packing
    )
    return nll / all_reduce_sum(count).clamp(min=1)


def actor_step(
    models: Models,
    exp: Experience,
    m: Minibatch,
    cfg: PPOStageConfig,
    unsup_batches=None,
    step: int = 0,
) -> dict:
    """One actor step on minibatch ``m``: the clipped policy loss (token, macro or sequence ratio,
    reduced by ``--loss_agg_mode`` with the whole minibatch's counts), minus ``--entropy_coef`` ×
    entropy, plus ``--kl_loss_coef`` × the KL to the reference, plus ``--unsup_coef`` × the SFT
    loss; with a token budget over the minibatch's :func:`micro_batches`, their gradients
    accumulated into the one step. Returns its stats."""
    parts = micro_batches(models.actor, exp, m, cfg)
    stats: dict = {}
    for i, part in enumerate(parts):
        loss, part_stats = actor_loss(models, exp, part, cfg, unsup_batches if i == 0 else None)
        _backward(models.actor, loss * m.world, i, len(parts))
        guarded_step(models.actor, step, "actor", loss)
        _add(stats, part_stats)
    if len(parts) > 1:
        accumulation_boundary(models.actor, None)
    return stats


def actor_loss(
    models: Models, exp: Experience, m: Minibatch, cfg: PPOStageConfig, unsup_batches=None
) -> tuple[torch.Tensor, dict]:
    """The actor's loss on (a micro-batch of) minibatch ``m`` and its stats (shares of the
    minibatch's: every mean is divided by ``m``'s whole-minibatch counts)."""
    ppo = cfg.ppo
    agg = {
        "loss_agg_mode": ppo.policy_loss_agg_mode,
        "num_seqs": m.num_seqs,
        "norm_length": float(cfg.generation.max_answer_seq_len),
    }
    mask = m.rollout.action_mask
    # the tokens the policy loss trains (--macro_credit boundary: each macro action's boundary)
    pg_mask = mask if exp.credit is None else mask & m.cut(exp.credit)
    stats: dict[str, torch.Tensor | float] = {}
    need_ent = ppo.entropy_coef > 0
    logp, ent = policy_forward(
        models.actor,
        m.rollout,
        cfg.generation.temperature,
        with_entropy=need_ent,
        all_positions=cfg.perf.score_all_positions,
        groups=cfg.perf.grouping,
    )
    pg, pstats = policy_loss(
        logp,
        m.cut(exp.old_logprobs),
        m.cut(exp.advantages),
        pg_mask,
        cliprange=ppo.cliprange,
        ratio_level=ppo.ratio_level,
        segment_ids=m.cut(exp.segment_ids),
        num_terms=m.num_terms,
        num_tokens=m.num_tokens if exp.credit is None else m.num_terms,
        is_weights=correction_weights(exp, m, cfg),
        **agg,
    )
    loss = pg
    if ppo.kl_loss_coef > 0:
        # verl's use_kl_loss: the per-token KL to the reference, reduced like the policy loss
        per_token = kl_penalty(logp, m.cut(exp.ref_logprobs), ppo.kl_loss_type)
        kl = agg_loss(
            per_token,
            mask,
            agg["loss_agg_mode"],
            num_terms=m.num_tokens,
            num_seqs=m.num_seqs,
            norm_length=agg["norm_length"],
        )
        loss = loss + ppo.kl_loss_coef * kl
        stats["loss/kl"] = kl.detach()
    if need_ent:
        ent_mean = entropy_bonus(ent, mask, num_tokens=m.num_tokens)
        loss = loss - ppo.entropy_coef * ent_mean
        stats["policy/entropy_train"] = ent_mean.detach()
    if unsup_batches is not None:
        unsup = unsup_loss(models.actor, unsup_batches, cfg.perf.grouping.packing)
        loss = loss + ppo.unsup_coef * unsup
        stats["loss/unsup"] = unsup.detach()
    stats.update(pstats)
    stats["loss/policy"] = pg.detach()
    return loss, stats


def micro_batches(engine, exp: Experience, m: Minibatch, cfg: PPOStageConfig) -> list[Minibatch]:
    """``m`` as ``engine`` trains on it: itself, or with ``--max_tokens_per_micro_batch`` its rows
    cut by that budget (:mod:`marlhf.runtime.micro_batches`; as many micro-batches on every
    rank), each with ``m``'s whole-minibatch counts, so their losses add up to ``m``'s."""
    grouping = cfg.perf.grouping
    if not grouping.max_tokens:
        return [m]
    packed = grouping.packing and packing_mode(engine.module) is not None
    parts = split_rows(
        sequence_lengths(m.rollout), grouping.max_tokens, packed=packed, agree=world_size() > 1
    )
    if len(parts) == 1:
        return [m]
    rows = [m.idx[p.to(m.idx.device)] for p in parts]
    return [replace(m, idx=r, rollout=slice_rollout(exp.rollout, r)) for r in rows]


def _backward(engine, loss: torch.Tensor, i: int, n: int) -> None:
    """The backward pass of micro-batch ``i`` of ``n`` of one optimizer step (the last one ends
    the step: :func:`marlhf.runtime.micro_batches.accumulation_boundary`)."""
    if n > 1:
        accumulation_boundary(engine, i == n - 1)
    engine.backward(loss)


def _add(total: dict, part: dict) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0.0) + v


def correction_weights(exp: Experience, m: Minibatch, cfg: PPOStageConfig):
    """The rollout correction's importance weights of minibatch ``m`` (mb, A'), or None when
    there is no correction or no record to correct against (`marlhf.algo.mismatch`)."""
    if cfg.correction == "none" or exp.rollout_logprobs is None:
        return None
    return importance_weights(
        m.cut(exp.trainer_logprobs),
        m.cut(exp.rollout_logprobs),
        m.rollout.action_mask,
        mode=cfg.correction,
        cap=cfg.ppo.rollout_is_cap,
        level=cfg.ppo.ratio_level,
        segment_ids=m.cut(exp.segment_ids),
    )


def critic_step(
    models: Models,
    exp: Experience,
    m: Minibatch,
    cfg: PPOStageConfig,
    values: torch.Tensor | None = None,
    step: int = 0,
) -> dict:
    """One critic step on minibatch ``m``: the value loss clipped around the old values (over the
    minibatch's :func:`micro_batches` with a token budget). ``values``: (mb, A') the critic's
    forward over ``m.rollout`` with its graph, if it was run already (:class:`KeptValues`); else
    it is run here."""
    if values is not None and values.shape != m.rollout.action_mask.shape:
        raise ValueError(
            f"kept critic values {tuple(values.shape)} do not fit the first minibatch "
            f"{tuple(m.rollout.action_mask.shape)}"
        )
    parts = [m] if values is not None else micro_batches(models.critic, exp, m, cfg)
    stats: dict = {}
    for i, part in enumerate(parts):
        if values is None:
            part_values = critic_forward(
                models.critic,
                part.rollout,
                all_positions=cfg.perf.score_all_positions,
                groups=cfg.perf.grouping,
            )
        else:
            part_values = values
        vl, vstats = value_loss(
            part_values,
            part.cut(exp.values),
            part.cut(exp.returns),
            part.rollout.action_mask,
            cliprange_value=cfg.ppo.cliprange_value,
            num_tokens=m.num_tokens,
        )
        _backward(models.critic, vl * m.world, i, len(parts))
        guarded_step(models.critic, step, "critic", vl)
        _add(stats, {**vstats, "loss/value": vl.detach()})
    if len(parts) > 1:
        accumulation_boundary(models.critic, None)
    return stats


def ppo_update(
    models: Models,
    exp: Experience,
    cfg: PPOStageConfig,
    train_actor: bool,
    generator: torch.Generator,
    unsup_batches=None,
    kept: KeptValues | None = None,
    step: int = 0,
) -> dict[str, float]:
    """One experience batch's PPO epochs (see the module docstring); the actor trains only when
    ``train_actor`` (after ``--critic_warmup_steps``). ``unsup_batches`` (an iterator of SFT batches)
    adds ``--unsup_coef`` × LM loss to the actor's loss. ``kept``: the first minibatch's critic
    forward, run while scoring; that minibatch's critic step then uses it and comes before its
    actor step (the two models are independent: the order changes nothing but which activations
    are held at once). ``step``: the PPO step being taken (for a non-finite loss or gradient's
    message, :func:`marlhf.runtime.finite.guarded_step`). Returns the stats' global means."""
    sums: dict[str, float] = {}
    n = 0
    for m in minibatches(exp, cfg.ppo, generator):
        stats: dict = {}
        if kept is not None:  # the first minibatch
            if not torch.equal(m.idx, kept.rows.to(m.idx.device)):
                raise ValueError("the kept critic values are not the first minibatch's rows")
            stats.update(critic_step(models, exp, m, cfg, values=kept.values, step=step))
        if train_actor:
            stats.update(actor_step(models, exp, m, cfg, unsup_batches, step=step))
        if models.critic is not None and kept is None:  # critic-free estimators build none
            stats.update(critic_step(models, exp, m, cfg, step=step))
        kept = None
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    # each rank's stats are its shares of the minibatch means: their sum over ranks is the mean
    keys = sorted(sums)
    device = exp.rollout.sequences.device
    total = all_reduce_sum(
        torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=device)
    )
    return {k: float(v) / max(n, 1) for k, v in zip(keys, total.tolist(), strict=True)}
