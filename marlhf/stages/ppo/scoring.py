"""2. Score a rollout: the forward passes (log π_old, log π_ref, entropies, critic values, the reward
model) and the sequence-level reward of each response (the sources of ``--reward_source``, the
``--reward_fn`` functions and the ``--reward_url`` server, added up by :mod:`marlhf.rewards`; and
Segment-PPO's dense segment rewards).

What the forward passes give is a :class:`Scored`; the sequence-level reward a (B,) tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from marlhf.algo.kl_rewards import spread_segment_rewards
from marlhf.data.long_tasks import gold_scorer_for
from marlhf.macro import (
    MacroConfig,
    TerminationInputs,
    TerminationRule,
    build_segments,
    build_termination,
    termination_inputs,
)
from marlhf.models.sequences import end_index
from marlhf.rewards.execution import has_prompt_tests
from marlhf.rewards.registry import RewardContext, build_sources
from marlhf.rewards.segment import segment_positions, segment_readout
from marlhf.rewards.terms import RewardBatch, RewardFn, combine
from marlhf.runtime.distributed import all_gather_padded, world_size
from marlhf.stages.ppo.forward import KeptValues, critic_forward, policy_forward, reward_forward
from marlhf.stages.ppo.models import eval_mode
from marlhf.stages.ppo.rollout import Rollout, pad_right, slice_rollout

if TYPE_CHECKING:
    from marlhf.data.config import DataConfig
    from marlhf.rewards.code import CodeRewarder
    from marlhf.rewards.segment import ScoreStats
    from marlhf.runtime.length_groups import Grouping
    from marlhf.stages.ppo.config import PerfConfig, PPOConfig, TrainerSettings
    from marlhf.stages.ppo.models import Models


@dataclass(frozen=True)
class Scored:
    """The forward passes over one rollout (B rows, A response tokens, T positions)."""

    old_logprobs: torch.Tensor  # (B, A) log π_old(a_t | s_t) at the sampling temperature
    entropy: torch.Tensor  # (B, A) entropy of π_old(· | s_t) at the sampling temperature
    ref_logprobs: torch.Tensor  # (B, A) log π_ref(a_t | s_t)
    values: torch.Tensor  # (B, A) critic V(s_t); 0 without a critic
    ref_entropy: torch.Tensor | None = None  # (B, A) entropy of π_ref, when a rule reads it
    rm_values: torch.Tensor | None = None  # (B, T) the reward model's value at every position
    rm_scores: torch.Tensor | None = None  # (B,) its value at each row's last token (the score)
    # the rollout engine's record of log π_old and the actor's own score of the same tokens, when
    # the trainer scored a recorded rollout (:func:`old_policy`; else None)
    rollout_logprobs: torch.Tensor | None = None  # (B, A) log π_rollout(a_t | s_t)
    trainer_logprobs: torch.Tensor | None = None  # (B, A) log π_trainer(a_t | s_t)


@dataclass(frozen=True)
class OldPolicy:
    """π_old of a rollout's tokens (:func:`old_policy`), all (B, A)."""

    logprobs: torch.Tensor  # log π_old(a_t | s_t): the record, or the trainer's score
    entropy: torch.Tensor  # entropy of π_old(· | s_t)
    rollout_logprobs: torch.Tensor | None = None  # the rollout engine's record, when checked
    trainer_logprobs: torch.Tensor | None = None  # the actor's score of the same tokens, then


def no_grad_mode(*engines):
    """``torch.inference_mode()``, or ``torch.no_grad()`` when one of ``engines`` is a trained
    ZeRO-3 engine: ZeRO-3 keeps small parameters gathered after their first fetch (its persistence
    threshold), and one first fetched under inference mode stays an inference tensor, which the
    next training forward cannot save for backward ("Inference tensors cannot be saved for
    backward", seen with two ranks)."""
    zero3 = any(
        e is not None and getattr(e, "optimizer", None) is not None
        and e.zero_optimization_stage() == 3
        for e in engines
    )  # fmt: skip
    return torch.no_grad() if zero3 else torch.inference_mode()


def score(
    models: Models,
    ro: Rollout,
    trainer: TrainerSettings,
    need_entropy: bool,
    later_values: torch.Tensor | None = None,
    check_rollout: bool = False,
) -> Scored:
    """The forward passes of one generation batch (:class:`Scored`), all with dropout off
    (:func:`marlhf.stages.ppo.models.eval_mode`) and without autograd (:func:`no_grad_mode`:
    ``torch.inference_mode``, or ``no_grad`` under ZeRO-3; the outputs are only read later).
    ``need_entropy``: also the reference's entropies (the termination rules that read them).
    log π_old and its entropy: :func:`old_policy`. ``later_values``: (k,) long rows whose critic
    values are left at 0 here (the update's first minibatch: :func:`kept_critic_values` computes
    them). ``check_rollout``: the actor also scores a recorded rollout (:func:`old_policy`)."""
    T = trainer.temperature
    full = trainer.perf.score_all_positions
    groups = None if full else trainer.perf.grouping
    critic = models.critic  # None: a critic-free estimator (values are 0)
    engines = [e for e in (models.actor, critic) if e is not None]
    with no_grad_mode(models.actor, critic), eval_mode(*engines):
        old = old_policy(models.actor, ro, trainer, check_rollout, groups)
        old_logp = old.logprobs
        ref_logp, ref_ent = policy_forward(
            models.ref, ro, T, with_entropy=need_entropy, all_positions=full, groups=groups
        )
        if critic is None:
            values = torch.zeros_like(old_logp)
        elif later_values is None:
            values = critic_forward(critic, ro, all_positions=full, groups=groups)
        else:
            values = torch.zeros_like(old_logp)
            rest = _other_rows(ro.sequences.shape[0], later_values)
            if len(rest):
                part = critic_forward(critic, slice_rollout(ro, rest), groups=groups)
                values[rest, : part.shape[1]] = part
    rm_values = rm_scores = None
    if models.reward is not None:
        rm_values = reward_forward(models.reward, ro, all_positions=full, groups=groups)
        rm_scores = torch.gather(rm_values, 1, end_index(ro.attention_mask).unsqueeze(1)).squeeze(1)
    return Scored(
        old_logprobs=old_logp,
        entropy=old.entropy,
        ref_logprobs=ref_logp,
        values=values,
        ref_entropy=ref_ent,
        rm_values=rm_values,
        rm_scores=rm_scores,
        rollout_logprobs=old.rollout_logprobs,
        trainer_logprobs=old.trainer_logprobs,
    )


def old_policy(
    actor, ro: Rollout, trainer: TrainerSettings, check_rollout: bool, groups: Grouping | None
) -> OldPolicy:
    """π_old of the rollout's tokens (:class:`OldPolicy`), with the rollout engine's record and
    the actor's own forward pass over the same tokens whenever the actor scores a recorded rollout
    for another reason, on a check step, or with a correction (else None: the ``rollout/*``
    metrics are logged exactly then).

    The record is π_old unless the actor scores it (``--recompute_old_logprobs``, a rollout
    correction: :attr:`~marlhf.stages.ppo.config.PPOStageConfig.correction`, no record, as with
    ``hf``, or a record without entropies, as with ``vllm``: the engine's log-probs are then the
    behaviour policy and the actor's are π_old, compared every step); ``check_rollout`` scores it
    too while keeping the record as π_old (the mismatch check, ``--mismatch_check_every``). Call
    with dropout off."""
    T, full = trainer.temperature, trainer.perf.score_all_positions
    recorded = ro.logprobs is not None
    partial = recorded and ro.entropy is None  # vLLM's record: log-probs, no entropies
    trainer_old = (
        not recorded
        or partial
        or trainer.perf.recompute_old_logprobs
        or trainer.correction != "none"
    )
    if not trainer_old and not check_rollout:
        return OldPolicy(ro.logprobs, ro.entropy)
    logp, ent = policy_forward(actor, ro, T, with_entropy=True, all_positions=full, groups=groups)
    pair = {}
    if recorded and (check_rollout or partial or trainer.correction != "none"):
        pair = {"rollout_logprobs": ro.logprobs, "trainer_logprobs": logp}
    if trainer_old:
        return OldPolicy(logp, ent, **pair)
    return OldPolicy(ro.logprobs, ro.entropy, **pair)


def _other_rows(B: int, rows: torch.Tensor) -> torch.Tensor:
    """The rows 0 … B−1 not in ``rows``, in order: (B − k,) long."""
    keep = torch.ones(B, dtype=torch.bool)
    keep[rows.cpu()] = False
    return keep.nonzero()[:, 0]


def reuses_critic_forward(models: Models, perf: PerfConfig) -> bool:
    """Whether the update's first minibatch takes its critic pass from scoring
    (``--reuse_critic_forward``): on one rank (elsewhere the first minibatch holds other ranks'
    rows), on the default path, without a token budget (the update's critic passes are then its
    micro-batches), with no dropout in the critic (scoring runs it without dropout, the update
    with it)."""
    if not perf.reuse_critic_forward or models.critic is None or world_size() != 1:
        return False
    if perf.batching.max_tokens_per_micro_batch:  # the update cuts the minibatch by tokens
        return False
    if perf.score_all_positions:
        return False
    for m in models.critic.module.modules():
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            return False
        p = getattr(m, "attention_dropout", None)
        if isinstance(p, float) and p > 0:
            return False
    return True


def kept_critic_values(
    models: Models, ro: Rollout, scored: Scored, rows: torch.Tensor, perf: PerfConfig
) -> tuple[Scored, KeptValues]:
    """The critic's pass over ``rows`` of ``ro`` with grad, as the update's first minibatch runs it
    (train mode: no dropout, see :func:`reuses_critic_forward`): ``scored`` with those rows' values
    (left at 0 by :func:`score`) filled in, and the pass
    (:class:`marlhf.stages.ppo.forward.KeptValues`) for the update."""
    values = critic_forward(models.critic, slice_rollout(ro, rows), groups=perf.grouping)
    filled = scored.values.clone()  # a normal tensor (scoring made an inference-mode one)
    filled[rows, : values.shape[1]] = values.detach()
    return replace(scored, values=filled), KeptValues(rows=rows, values=values)


def concat_scored(scoreds: list[Scored], seq_width: int, num_actions: int) -> Scored:
    """Concatenate the :class:`Scored` of generation batches, right-padding per-token tensors with 0
    to ``seq_width`` (``rm_values``) or ``num_actions`` (the rest)."""
    if len(scoreds) == 1:
        return scoreds[0]
    parts: dict[str, torch.Tensor | None] = {}
    for f in fields(Scored):
        vals = [getattr(s, f.name) for s in scoreds]
        if vals[0] is None:
            parts[f.name] = None
        elif vals[0].dim() == 1:
            parts[f.name] = torch.cat(vals)
        else:
            width = seq_width if f.name == "rm_values" else num_actions
            parts[f.name] = torch.cat([pad_right(v, width, 0.0) for v in vals])
    return Scored(**parts)


# --------------------------------------------------------------------------------------------------
# sequence-level rewards


def gold_scorer(data: DataConfig):
    """The synthetic task's true quality, logged when the prompts come from it (else None):
    ``synthetic-tldr`` or a long-horizon task (`marlhf.data.long_tasks.gold_scorer_for`)."""
    return gold_scorer_for(data.data_path)


def has_tests(meta_json: str) -> bool:
    """Whether a prompt's ``meta`` (JSON) holds usable test cases for the code reward."""
    return has_prompt_tests(meta_json)


def response_texts(ro: Rollout, tokenizer) -> list[str]:
    """The rollout's B responses as text (padding masked, special tokens dropped): what the
    rewards read."""
    return tokenizer.batch_decode(
        ro.response_ids.masked_fill(~ro.action_mask, tokenizer.pad_token_id),
        skip_special_tokens=True,
    )


def reward_scores(
    ro: Rollout,
    rm_scores: torch.Tensor | None,
    metas: list[dict],
    prompt_texts: list[str],
    tokenizer,
    sources: tuple[RewardFn, ...],
    errors: str = "raise",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sequence-level reward of each response, (B,) on the rollout's device: the sum of what
    ``sources`` (:func:`marlhf.rewards.registry.build_sources`,
    :func:`marlhf.rewards.sources.custom_rewards`) give, in their order
    (:func:`marlhf.rewards.terms.combine`), and their metrics (``code/*``, ``reward/*``).
    ``rm_scores``: (B,) the reward model's end scores (:attr:`Scored.rm_scores`), or None."""
    batch = RewardBatch(list(prompt_texts), response_texts(ro, tokenizer), metas, rm_scores)
    terms = [t for source in sources for t in source(batch)]
    return combine(terms, batch, ro.sequences.device, errors)


def builtin_sources(
    rm: bool, ppo: PPOConfig, rewarder=None, score_stats=None, oracle=None
) -> tuple[RewardFn, ...]:
    """The registered sources of the arguments of :func:`sequence_scores`, in the order they add
    up: the ``oracle`` (gold), the reward model's scores when ``rm`` (normalised with
    ``--normalize_reward``), the code ``rewarder``."""
    names = [n for n, on in (("gold", oracle), ("rm", rm), ("code", rewarder)) if on]
    return build_sources(names, RewardContext(oracle, rewarder, ppo.normalize_reward, score_stats))


def sequence_scores(
    ro: Rollout,
    rm_scores: torch.Tensor | None,
    metas: list[dict],
    tokenizer,
    ppo: PPOConfig,
    rewarder=None,
    score_stats=None,
    oracle=None,
    prompt_texts: list[str] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sequence-level reward of each response, (B,): the reward model's end score ``rm_scores``
    ((B,), :attr:`Scored.rm_scores`; None without a reward model), normalised with
    ``--normalize_reward``, plus, with a ``rewarder`` (``--reward_source code`` or
    ``rm+code``), the execution reward of the program against ``metas[b]``'s tests, plus, with an
    ``oracle`` (``--reward_source gold``: ``oracle(prompt, response_text) -> float``), the oracle's
    score of each response to ``prompt_texts[b]``. Returns the scores and the ``code/*`` metrics
    ({} without a rewarder). The (clipped) score goes on each row's last valid token
    (:func:`marlhf.stages.ppo.experience.token_rewards`)."""
    B = ro.sequences.shape[0]
    if oracle is not None and (prompt_texts is None or len(prompt_texts) != B):
        raise ValueError("an oracle reward needs one prompt text per response")
    sources = builtin_sources(rm_scores is not None, ppo, rewarder, score_stats, oracle)
    texts = prompt_texts if prompt_texts is not None else [""] * B
    return reward_scores(ro, rm_scores, metas, texts, tokenizer, sources)


@dataclass(frozen=True)
class SequenceReward:
    """The step's sequence-level reward, built once by the loop and read by the step, by
    ``macro_mc``'s continuations and by the held-out evaluation alike:
    ``reward(ro, rm_scores, metas, prompt_texts)`` is :func:`reward_scores` over ``sources`` (the
    run's ``--reward_source``, ``--reward_fn`` and ``--reward_url``:
    :func:`marlhf.rewards.registry.build_sources`, :func:`marlhf.rewards.sources.custom_rewards`),
    or, without ``sources``,
    :func:`sequence_scores` with the run's tokenizer, reward settings, code rewarder, the reward
    model's score statistics and the oracle."""

    tokenizer: Any
    ppo: PPOConfig
    rewarder: CodeRewarder | None = None
    score_stats: ScoreStats | None = None
    oracle: Callable[[str, str], float] | None = None
    sources: tuple[RewardFn, ...] = ()
    errors: str = "raise"  # --reward_errors

    def __call__(
        self,
        ro: Rollout,
        rm_scores: torch.Tensor | None,
        metas: list[dict],
        prompt_texts: list[str],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if self.sources:
            return reward_scores(
                ro, rm_scores, metas, prompt_texts, self.tokenizer, self.sources, self.errors
            )
        return sequence_scores(
            ro,
            rm_scores,
            metas,
            self.tokenizer,
            self.ppo,
            self.rewarder,
            self.score_stats,
            oracle=self.oracle,
            prompt_texts=prompt_texts,
        )


# --------------------------------------------------------------------------------------------------
# Segment-PPO's dense rewards (--dense_reward)


def segment_rule(models: Models, tokenizer):
    """The termination rule the segment reward model was trained with (its reward_config.json)
    and its location-aware normaliser (or None)."""
    info = models.reward_info or {}
    if info.get("rm_type") != "segment":
        raise ValueError(
            "--dense_reward needs a segment reward model (stage 2 with --rm_type segment)"
        )
    seg_cfg = MacroConfig(
        **{k: (tuple(v) if isinstance(v, list) else v) for k, v in info["termination"].items()}
    )
    return build_termination(seg_cfg, tokenizer), info.get("normalizer")


def dense_rewards(
    seg_rule,
    normalizer,
    ro: Rollout,
    scored: Scored,
    ppo: PPOConfig,
    seeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Segment-PPO dense rewards (B, A): the segment RM's value at each of its segments' last
    tokens, location-normalised (``normalizer``), spread over the segment's tokens. ``seg_rule`` and
    ``normalizer``: from :func:`segment_rule`."""
    if scored.rm_values is None:
        raise ValueError("--dense_reward needs the segment reward model's per-token values")
    term = seg_rule(rollout_termination_inputs(seg_rule, ro, scored, seeds, all_gather_padded))
    seg_rewards, seg_mask = segment_readout(scored.rm_values, ro.response_start, term.macro_end)
    if normalizer is not None:
        seg_rewards = normalizer.apply(seg_rewards, segment_positions(seg_mask)) * seg_mask
    seg_ids = build_segments(term.macro_end, ro.action_mask).ids
    return spread_segment_rewards(seg_rewards, seg_ids, ppo.dense_reward_mode)


def rollout_termination_inputs(
    rule: TerminationRule,
    ro: Rollout,
    scored: Scored,
    row_seeds: torch.Tensor | None = None,
    all_gather: Callable | None = None,
) -> TerminationInputs:
    """What ``rule`` reads of a scored rollout (`marlhf.macro.rules.termination_inputs`): the
    reference model's log-probs and entropies, the rollout's log π_old of the sampled tokens and
    a multi-turn rollout's turn ends."""
    return termination_inputs(
        rule,
        ro.response_ids,
        ro.action_mask,
        ro.ends_with_eos,
        ref_logprobs=scored.ref_logprobs,
        ref_entropy=scored.ref_entropy,
        old_logprobs=scored.old_logprobs,
        row_seeds=row_seeds,
        all_gather=all_gather,
        turn_end=ro.turn_end,
    )
