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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from marlhf.algo.kl_rewards import kl_penalty
from marlhf.algo.losses import agg_loss, entropy_bonus, policy_loss, policy_terms, value_loss
from marlhf.algo.mismatch import importance_weights
from marlhf.models.lm_loss import lm_loss_sum
from marlhf.runtime.distributed import all_reduce_sum, rank, world_size
from marlhf.stages.ppo.experience import Experience
from marlhf.stages.ppo.forward import KeptValues, critic_forward, policy_forward
from marlhf.stages.ppo.rollout import Rollout, slice_rollout

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


def unsup_loss(actor, batches: Iterator[dict]) -> torch.Tensor:
    """The SFT LM loss of this rank's next pretraining-mix batch, divided by the SFT tokens of all
    ranks' batches (like the PPO terms)."""
    sft = {k: v.to(actor.device) for k, v in next(batches).items()}
    logits = actor(input_ids=sft["input_ids"], attention_mask=sft["attention_mask"]).logits
    nll, count = lm_loss_sum(logits, sft["labels"])
    return nll / all_reduce_sum(count).clamp(min=1)


def actor_step(
    models: Models, exp: Experience, m: Minibatch, cfg: PPOStageConfig, unsup_batches=None
) -> dict:
    """One actor step on minibatch ``m``: the clipped policy loss (token, macro or sequence ratio,
    reduced by ``--loss_agg_mode`` with the whole minibatch's counts), minus ``--entropy_coef`` ×
    entropy, plus ``--kl_loss_coef`` × the KL to the reference, plus ``--unsup_coef`` × the SFT
    loss. Returns its stats."""
    ppo = cfg.ppo
    agg = {
        "loss_agg_mode": ppo.policy_loss_agg_mode,
        "num_seqs": m.num_seqs,
        "norm_length": float(cfg.generation.max_answer_seq_len),
    }
    mask = m.rollout.action_mask
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
        mask,
        cliprange=ppo.cliprange,
        ratio_level=ppo.ratio_level,
        segment_ids=m.cut(exp.segment_ids),
        num_terms=m.num_terms,
        num_tokens=m.num_tokens,
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
        unsup = unsup_loss(models.actor, unsup_batches)
        loss = loss + ppo.unsup_coef * unsup
        stats["loss/unsup"] = unsup.detach()
    models.actor.backward(loss * m.world)
    models.actor.step()
    stats.update(pstats)
    stats["loss/policy"] = pg.detach()
    return stats


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
) -> dict:
    """One critic step on minibatch ``m``: the value loss clipped around the old values.
    ``values``: (mb, A') the critic's forward over ``m.rollout`` with its graph, if it was run
    already (:class:`KeptValues`); else it is run here."""
    if values is None:
        values = critic_forward(
            models.critic,
            m.rollout,
            all_positions=cfg.perf.score_all_positions,
            groups=cfg.perf.grouping,
        )
    elif values.shape != m.rollout.action_mask.shape:
        raise ValueError(
            f"kept critic values {tuple(values.shape)} do not fit the first minibatch "
            f"{tuple(m.rollout.action_mask.shape)}"
        )
    vl, vstats = value_loss(
        values,
        m.cut(exp.values),
        m.cut(exp.returns),
        m.rollout.action_mask,
        cliprange_value=cfg.ppo.cliprange_value,
        num_tokens=m.num_tokens,
    )
    models.critic.backward(vl * m.world)
    models.critic.step()
    return {**vstats, "loss/value": vl.detach()}


def ppo_update(
    models: Models,
    exp: Experience,
    cfg: PPOStageConfig,
    train_actor: bool,
    generator: torch.Generator,
    unsup_batches=None,
    kept: KeptValues | None = None,
) -> dict[str, float]:
    """One experience batch's PPO epochs (see the module docstring); the actor trains only when
    ``train_actor`` (after ``--critic_warmup_steps``). ``unsup_batches`` (an iterator of SFT batches)
    adds ``--unsup_coef`` × LM loss to the actor's loss. ``kept``: the first minibatch's critic
    forward, run while scoring; that minibatch's critic step then uses it and comes before its
    actor step (the two models are independent: the order changes nothing but which activations
    are held at once). Returns the stats' global means."""
    sums: dict[str, float] = {}
    n = 0
    for m in minibatches(exp, cfg.ppo, generator):
        stats: dict = {}
        if kept is not None:  # the first minibatch
            if not torch.equal(m.idx, kept.rows.to(m.idx.device)):
                raise ValueError("the kept critic values are not the first minibatch's rows")
            stats.update(critic_step(models, exp, m, cfg, values=kept.values))
        if train_actor:
            stats.update(actor_step(models, exp, m, cfg, unsup_batches))
        if models.critic is not None and kept is None:  # critic-free estimators build none
            stats.update(critic_step(models, exp, m, cfg))
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
