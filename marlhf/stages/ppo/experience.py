"""3.–4. From a scored rollout to experience: segment the responses into macro actions, compose the
per-token rewards, gather the global batch over ranks, and estimate advantages and returns.

Segmenting and rewards are per row, so each rank does its own rows; the estimate runs on the
global batch (every rank holds every row after :func:`gather_experience`), so an estimator may use
batch- or group-level statistics and still give the one-process result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from marlhf.algo.estimators import (
    EstimatorInputs,
    EstimatorOptions,
    MCBoundaries,
    MCValues,
    build_estimator,
    estimator_class,
    with_turn_rewards,
)
from marlhf.algo.groups import group_ids, group_stats
from marlhf.algo.kl_rewards import compose_rewards, kl_penalty, sequence_rewards
from marlhf.algo.kl_rewards import token_rewards as kl_token_rewards
from marlhf.algo.losses import masked_mean, masked_whiten
from marlhf.algo.macro_gae import macro_stats
from marlhf.macro import MacroSegments, build_segments
from marlhf.macro.credit import credit_mask
from marlhf.runtime.distributed import all_gather_object, all_gather_padded, world_size
from marlhf.runtime.finite import check_finite
from marlhf.stages.ppo.rollout import TURN_FIELDS, Rollout
from marlhf.stages.ppo.scoring import rollout_termination_inputs

if TYPE_CHECKING:
    from marlhf.macro.termination import TerminationOutput, TerminationRule
    from marlhf.stages.ppo.config import PPOConfig, PPOStageConfig
    from marlhf.stages.ppo.scoring import Scored


@dataclass
class Experience:
    """A scored rollout with its macro actions, rewards and (once estimated) advantages (B rows).

    Under data parallelism it holds the global batch, every rank's rows on every rank in the order of
    one process with the whole batch (:func:`gather_experience`).
    """

    rollout: Rollout
    old_logprobs: torch.Tensor  # (B, A) log π_old(a_t | s_t) at the sampling temperature
    ref_logprobs: torch.Tensor  # (B, A) log π_ref(a_t | s_t)
    values: torch.Tensor  # (B, A) critic V(s_t), 0 on padding
    scores: torch.Tensor  # (B,) sequence reward before clipping (RM score normalised / code / gold)
    kl: torch.Tensor  # (B, A) per-token KL estimate, 0 on padding
    rewards: torch.Tensor  # (B, A) per-token rewards: −β·KL, + clipped score on the last token
    segment_ids: torch.Tensor  # (B, A) macro index of each token, -1 on padding
    entropy: torch.Tensor  # (B, A) entropy of π_old(· | s_t) at the sampling temperature
    fallback: torch.Tensor  # (B,) bool rows whose termination rule fell back to `fixed`
    advantages: torch.Tensor | None = None  # (B, A) macro advantage broadcast to its tokens
    returns: torch.Tensor | None = None  # (B, A) the critic's targets (None: critic-free)
    stats: dict[str, float] = field(default_factory=dict)
    # the two parts of `rewards` apart, for the estimators (marlhf.algo.estimators)
    kl_rewards: torch.Tensor | None = None  # (B, A) −β·KL_t (+ dense), 0 on padding
    outcome: torch.Tensor | None = None  # (B,) clipped score (+ no-EOS penalty)
    # macro_mc (marlhf.stages.ppo.mc): Monte-Carlo values at the chosen macro-action boundaries
    mc_positions: torch.Tensor | None = None  # (B, N) long  boundary positions, -1 where none
    mc_values: torch.Tensor | None = None  # (B, N) float  V̂ there (mean continuation reward)
    mc_prompt_values: torch.Tensor | None = None  # (B,) V̂(prompt) (G = 1 only; else None)
    # the rollout engine's record of log π_old and the actor's own score of the same tokens, when
    # the trainer scored a recorded rollout (marlhf.stages.ppo.scoring.old_policy; else None)
    rollout_logprobs: torch.Tensor | None = None  # (B, A) log π_rollout(a_t | s_t), 0 on padding
    trainer_logprobs: torch.Tensor | None = None  # (B, A) log π_trainer(a_t | s_t), 0 on padding
    # --macro_credit boundary: (B, A) bool the tokens the policy loss trains (None: all valid ones)
    credit: torch.Tensor | None = None


# --------------------------------------------------------------------------------------------------
# 3. segment and reward (per row)


def segment(
    rule: TerminationRule,
    ro: Rollout,
    scored: Scored,
    row_seeds: torch.Tensor | None = None,
    all_gather: Callable | None = None,
) -> TerminationOutput:
    """Macro actions of every response by the termination rule (``macro_end`` (B, A) bool).

    ``row_seeds`` ((B,) long, `marlhf.runtime.rows.derive_row_seeds`) and ``all_gather``
    (`marlhf.runtime.distributed.all_gather_padded`) make the segments independent of the split over ranks
    (``randomized``: per-row draws; ``entropy``: tau over all ranks' rows)."""
    return rule(rollout_termination_inputs(rule, ro, scored, row_seeds, all_gather))


def token_rewards(
    ro: Rollout,
    scored: dict,
    scores: torch.Tensor,
    term: TerminationOutput,
    ppo: PPOConfig,
    kl_coef: float,
    dense: torch.Tensor | None = None,
) -> Experience:
    """The per-token rewards: r_t = −β·KL_t, + the (clipped) sequence score on the last response
    token (+ ``--no_eos_penalty`` if cut, + ``dense`` segment rewards, + a multi-turn rollout's
    per-turn rewards on each turn's last action token); an Experience without advantages.
    ``scores``: (B,) sequence rewards (:func:`marlhf.stages.ppo.scoring.sequence_scores`). The parts
    of the rewards are kept apart too (``kl_rewards``, ``outcome``, and the per-turn rewards in
    ``rollout.turn_rewards``, which each estimator takes as it says:
    :func:`marlhf.algo.estimators.with_turn_rewards`): ``rewards`` is ``kl_rewards`` plus the
    per-turn rewards, with ``outcome`` added on the last valid token."""
    mask = ro.action_mask
    segments = build_segments(term.macro_end, mask)
    kl = kl_penalty(scored.old_logprobs, scored.ref_logprobs, ppo.kl_estimator) * mask
    clip = ppo.reward_clip if ppo.reward_clip > 0 else None
    every = dense
    if ro.turn_rewards is not None:
        every = ro.turn_rewards if dense is None else dense + ro.turn_rewards
    rewards = compose_rewards(
        kl,
        scores,
        mask,
        kl_coef=kl_coef,
        reward_clip=clip,
        ends_with_eos=ro.ends_with_eos,
        no_eos_penalty=ppo.no_eos_penalty,
        dense=every,
    )
    kl_rewards = kl_token_rewards(kl, mask, kl_coef=kl_coef, dense=dense)
    outcome = sequence_rewards(
        scores,
        mask,
        reward_clip=clip,
        ends_with_eos=ro.ends_with_eos,
        no_eos_penalty=ppo.no_eos_penalty,
        dtype=kl_rewards.dtype,
    )
    return Experience(
        rollout=ro,
        old_logprobs=scored.old_logprobs,
        ref_logprobs=scored.ref_logprobs,
        values=scored.values * mask,
        scores=scores,
        kl=kl,
        rewards=rewards,
        segment_ids=segments.ids,
        entropy=scored.entropy,
        fallback=term.fallback,
        kl_rewards=kl_rewards,
        outcome=outcome,
        rollout_logprobs=_masked(scored.rollout_logprobs, mask),
        trainer_logprobs=_masked(scored.trainer_logprobs, mask),
    )


def _masked(x: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
    """(B, A) float with 0 on padding (None stays None)."""
    return None if x is None else x.masked_fill(~mask.bool(), 0.0)


# --------------------------------------------------------------------------------------------------
# 4. estimate (global batch)


def macro_ends(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, A) bool macro_end from (B, A) segment ids (-1 on padding): a token whose successor is in
    another macro action (or is padding)."""
    following = torch.nn.functional.pad(segment_ids[:, 1:], (0, 1), value=-1)
    return (segment_ids >= 0) & (following != segment_ids)


def segments_of(exp: Experience) -> MacroSegments:
    """The macro layout of ``exp``'s rows, rebuilt from their segment ids."""
    return build_segments(macro_ends(exp.segment_ids), exp.rollout.action_mask)


def estimate_advantages(
    exp: Experience, segments: MacroSegments, cfg: PPOStageConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The advantage estimator (``--advantage_estimator``, :mod:`marlhf.algo.estimators`):
    (advantages (B, A), returns (B, A) or None) of the global batch ``exp``. This is the one place
    advantages are made, every estimator through the registry.

    ``gae``: GAE over macro actions with the critic's values (MA-RLHF Sec. 3.2,
    :func:`marlhf.algo.macro_gae.macro_advantages`), each token carrying its macro action's A_k and
    G_k; ``--termination_condition fixed --ngram 1`` is token-level PPO exactly. It reads the KL
    rewards and the outcome apart, so the sequence score enters the last macro action whole with
    ``--macro_reward_agg weighted`` (with ``sum`` the same bits as the score on the last token).
    The critic-free estimators read the KL rewards, the outcome, the group of each row
    (:func:`marlhf.algo.groups.group_ids`) and ``macro_mc``'s Monte-Carlo values; their returns are
    None (``reinforce_pp``: its returns, for logging). Whitened over the batch's valid tokens with
    ``--whiten_advantages``."""
    ppo, mcfg = cfg.ppo, cfg.macro
    mask = exp.rollout.action_mask
    options = EstimatorOptions(
        gamma=ppo.gamma,
        lam=ppo.lam,
        value_function=mcfg.value_function,
        reward_agg=mcfg.macro_reward_agg,
    )
    adv, ret = build_estimator(ppo.estimator, options)(estimator_inputs(exp, segments, ppo))
    if ppo.whiten_advantages:  # over the tokens the policy loss trains
        adv = masked_whiten(adv, mask if exp.credit is None else exp.credit)
    return adv, ret


def estimator_inputs(exp: Experience, segments: MacroSegments, ppo: PPOConfig) -> EstimatorInputs:
    """What the estimator of ``--advantage_estimator`` reads from the global batch ``exp``: the
    critic's values only for one that reads a critic; a multi-turn rollout's per-turn rewards
    where the estimator takes them (:func:`marlhf.algo.estimators.with_turn_rewards`)."""
    mask = exp.rollout.action_mask
    G = ppo.n_samples_per_prompt
    mc = None
    if exp.mc_positions is not None:
        pos = exp.mc_positions
        valid = pos >= 0
        macro = torch.where(valid, segments.ids.gather(1, pos.clamp(min=0)), -1)
        mc = MCValues(
            boundaries=MCBoundaries(positions=pos, mask=valid, macro_index=macro),
            values=exp.mc_values,
            prompt_values=exp.mc_prompt_values,
        )
    inputs = EstimatorInputs(
        kl_rewards=exp.kl_rewards,
        scores=exp.outcome,
        action_mask=mask,
        segments=segments,
        values=exp.values if ppo.needs_critic else None,
        group_ids=group_ids(mask.shape[0], G, mask.device) if G > 1 else None,
        mc=mc,
    )
    ro = exp.rollout
    if ro.turn_rewards is None:
        return inputs
    how = estimator_class(ppo.advantage_estimator).turn_rewards
    return with_turn_rewards(inputs, how, ro.turn_rewards, ro.turn_end, ro.turn_index)


def experience_stats(
    exp: Experience, segments: MacroSegments, term: TerminationOutput
) -> dict[str, float]:
    """The batch's ``macro/*``, ``objective/kl``, ``objective/reward``, ``response/*`` and
    ``policy/entropy`` metrics, and what the termination rule chose (entropy: tau)."""
    mask = exp.rollout.action_mask
    stats = macro_stats(segments, exp.fallback)
    stats.update(
        {
            "objective/kl": float((exp.kl.sum(1)).mean()),
            "objective/reward": float((exp.rewards.sum(1)).mean()),
            "response/length": float(mask.sum(1).float().mean()),
            "response/eos_rate": float(exp.rollout.ends_with_eos.float().mean()),
            "policy/entropy": float(masked_mean(exp.entropy, mask)),
        }
    )
    stats.update(term.stats)
    return stats


def estimate(exp: Experience, term: TerminationOutput, cfg: PPOStageConfig) -> Experience:
    """4. ``exp`` (the global batch, :func:`gather_experience`) with its advantages, returns and
    statistics."""
    segments = segments_of(exp)
    mcfg = cfg.macro
    if mcfg.macro_credit != "all":  # the tokens the policy loss trains (marlhf.macro.credit)
        exp = replace(exp, credit=credit_mask(segments, mcfg))
    advantages, returns = estimate_advantages(exp, segments, cfg)
    stats = experience_stats(exp, segments, term)
    if exp.credit is not None:
        mask = exp.rollout.action_mask
        stats["macro/credit_share"] = float(exp.credit.sum() / mask.sum().clamp(min=1))
    G = cfg.ppo.n_samples_per_prompt
    if G > 1 and exp.outcome is not None:
        stats.update(group_stats(exp.outcome, group_ids(len(exp.outcome), G, exp.outcome.device)))
    return replace(exp, advantages=advantages, returns=returns, stats=stats)


def make_experience(
    rule: TerminationRule,
    ro: Rollout,
    scored: Scored,
    scores: torch.Tensor,
    ppo: PPOConfig,
    kl_coef: float,
    *,
    row_seeds: torch.Tensor | None = None,
    dense: torch.Tensor | None = None,
    all_gather: Callable | None = None,
) -> tuple[TerminationOutput, Experience]:
    """3. This rank's rows as experience: macro actions by the termination rule (:func:`segment`;
    ``row_seeds`` and ``all_gather`` make them independent of the split over ranks), then the
    per-token rewards (:func:`token_rewards`; ``scores``: (B,) sequence rewards, ``dense``: Segment-PPO's
    dense rewards). The loop then gathers the global batch (:func:`gather_experience`) and
    estimates it (:func:`estimate`)."""
    term = segment(rule, ro, scored, row_seeds, all_gather)
    return term, token_rewards(ro, scored, scores, term, ppo, kl_coef, dense)


# --------------------------------------------------------------------------------------------------
# the global batch


def gather_experience(exp: Experience, pad_id: int, block: int) -> Experience:
    """Every data-parallel rank's rows on every rank, in the order of one process with the whole batch.

    Each rank holds ``B`` rows made of generation batches of ``block`` rows; rank ``r``'s batch ``j``
    is global batch ``j·world + r`` (``marlhf.runtime.batching.step_micro_batches``), so the gathered
    rank-major rows are reordered batch-major. Widths (T, A) are right-padded to the widest rank's.
    The estimate and the PPO update then see the same global batch whatever the world size.
    """
    ws = world_size()
    if ws == 1:
        return exp
    ro = exp.rollout
    B = ro.sequences.shape[0]
    # gathered row (r, j, k) -> global row (j, r, k)
    order = torch.arange(ws * B).view(ws, B // block, block).transpose(0, 1).reshape(-1)

    def rows(x: torch.Tensor, pad) -> torch.Tensor:
        return all_gather_padded(x, pad)[order.to(x.device)]

    prompt_ids = sum(all_gather_object(ro.prompt_ids), [])
    return Experience(
        rollout=Rollout(
            sequences=rows(ro.sequences, pad_id),
            attention_mask=rows(ro.attention_mask, False),
            response_start=rows(ro.response_start, 0),
            response_ids=rows(ro.response_ids, pad_id),
            action_mask=rows(ro.action_mask, False),
            ends_with_eos=rows(ro.ends_with_eos, False),
            prompt_ids=[prompt_ids[i] for i in order.tolist()],
            **{
                k: rows(getattr(ro, k), pad)
                for k, pad in TURN_FIELDS.items()
                if getattr(ro, k) is not None
            },
        ),
        old_logprobs=rows(exp.old_logprobs, 0.0),
        ref_logprobs=rows(exp.ref_logprobs, 0.0),
        values=rows(exp.values, 0.0),
        scores=rows(exp.scores, 0.0),
        kl=rows(exp.kl, 0.0),
        rewards=rows(exp.rewards, 0.0),
        segment_ids=rows(exp.segment_ids, -1),
        entropy=rows(exp.entropy, 0.0),
        fallback=rows(exp.fallback, False),
        **{
            k: rows(getattr(exp, k), pad)
            for k, pad in _OPTIONAL_ROWS.items()
            if getattr(exp, k) is not None
        },
    )


# the optional per-row fields of an Experience and their padding
_OPTIONAL_ROWS = {
    "kl_rewards": 0.0,
    "outcome": 0.0,
    "mc_positions": -1,
    "mc_values": 0.0,
    "mc_prompt_values": 0.0,
    "rollout_logprobs": 0.0,
    "trainer_logprobs": 0.0,
}


def check_experience(exp: Experience, step: int) -> None:
    """Stop the run (:class:`marlhf.runtime.finite.NonFiniteError`) when a sequence reward, a
    critic value, a per-token reward, an advantage or a return of the step is NaN or infinite,
    before the update: a reward model or critic with a broken head would otherwise turn every
    weight into NaN. ``exp``: the global batch (every rank decides alike)."""
    check_finite(
        step,
        {
            "the sequence reward (objective/score)": exp.scores,
            "the critic's values": exp.values,
            "the per-token reward": exp.rewards,
            "the advantages": exp.advantages,
            "the returns": exp.returns,
        },
    )
