"""The training loop of stage 3 (MA-RLHF, Alg. 1). Each PPO step:

1. generate  — sample this step's prompts, generate responses with the actor    (rollout.py;
               with --env, play multi-turn episodes on the environment          multiturn.py)
2. score     — log π_old, log π_ref (+ entropy), critic values, reward-model score, and the
               sequence-level reward of each response                            (scoring.py)
3. segment   — termination rule → macro actions (``--termination_condition``); per-token rewards
               r_t = −β·KL_t, + clipped score on the last response token; gathered over ranks
4. estimate  — advantages (``--advantage_estimator``): GAE over macro actions with the critic,
               broadcast to tokens (``--termination_condition fixed --ngram 1`` is token-level
               PPO), or critic-free: GRPO / Dr. GRPO / RLOO over the ``--n_samples_per_prompt``
               samples of a prompt, REINFORCE++, or ``macro_mc`` with Monte-Carlo values at
               macro-action boundaries (mc.py; with --env at turn boundaries, mc_env.py)
                                                                                 (experience.py)
5. update    — ``--ppo_epochs`` × minibatches: clipped policy loss (token, macro or sequence
               ratio; ``--loss_agg_mode``), clipped value loss (with a critic)   (update.py)
6. log/save  — metrics, checkpoints                                              (state.py)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from marlhf.algo.losses import explained_variance, masked_mean
from marlhf.algo.mismatch import mismatch_metrics
from marlhf.cli import config_to_dict, flag_values
from marlhf.data.collate import PromptCollator
from marlhf.data.env_rows import load_env_rows
from marlhf.macro import TerminationRule, build_termination
from marlhf.macro.render import render_terminal, token_pieces
from marlhf.models.checks import ppo_model_roles
from marlhf.models.context import check_context
from marlhf.models.load import load_tokenizer
from marlhf.rewards.code import CodeRewarder
from marlhf.rewards.registry import RewardContext, build_sources, check_sources, source_names
from marlhf.rewards.sources import check_columns, custom_rewards
from marlhf.rewards.sources import describe as describe_reward
from marlhf.runtime import preemption, startup
from marlhf.runtime.checkpoint import write_json
from marlhf.runtime.distributed import all_gather_padded, all_reduce_mean, is_main, rank
from marlhf.runtime.resources import PhaseResources
from marlhf.runtime.rows import derive_row_seeds, global_rows
from marlhf.stages.common import check_resume, ensure_output_dir, log_eval, start
from marlhf.stages.ppo import sampler as rollout_sampler
from marlhf.stages.ppo.config import (
    ActorCriticConfig,
    GenerationConfig,
    PerfConfig,
    PPOConfig,
    PPOStageConfig,
    TrainerSettings,
)
from marlhf.stages.ppo.evaluation import due as eval_due
from marlhf.stages.ppo.evaluation import evaluate_policy, load_eval_prompts
from marlhf.stages.ppo.experience import (
    Experience,
    check_experience,
    estimate,
    gather_experience,
    make_experience,
)
from marlhf.stages.ppo.mc import Continuations, monte_carlo
from marlhf.stages.ppo.mc_env import env_monte_carlo
from marlhf.stages.ppo.models import Models, build_models, check_seen_settings, model_config
from marlhf.stages.ppo.multiturn import (
    EnvRollouts,
    check_first_prompt,
    collect_episodes,
    env_scores,
    env_setup,
    turn_mismatch_metrics,
)
from marlhf.stages.ppo.naming import run_label
from marlhf.stages.ppo.prompts import (
    RolloutPlan,
    generation_batches,
    load_prompts,
    plan_rollouts,
    prompt_metas,
    sft_batches,
)
from marlhf.stages.ppo.rollout import Rollout, concat_rollouts, eos_token_ids, generate
from marlhf.stages.ppo.scoring import (
    Scored,
    SequenceReward,
    concat_scored,
    dense_rewards,
    gold_scorer,
    kept_critic_values,
    reuses_critic_forward,
    score,
    segment_rule,
)
from marlhf.stages.ppo.state import TrainState, open_tracker, resume, save_checkpoint
from marlhf.stages.ppo.update import first_minibatch_rows, ppo_update

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from marlhf.config import LoggingConfig
    from marlhf.data.config import DataConfig
    from marlhf.envs.config import EnvConfig
    from marlhf.macro.config import MacroConfig
    from marlhf.rewards.code import CodeRewardConfig
    from marlhf.rewards.segment import LocationNormalizer

log = logging.getLogger("marlhf.ppo")


def train(cfg: PPOStageConfig) -> Path:
    """Stage 3 from the start (or its latest checkpoint) to the final actor (and critic)."""
    run = setup(cfg)
    try:
        return _train(run)
    except BaseException:
        rollout_sampler.abandon(run.models)  # before the process group is torn down
        raise


def _train(run: Run) -> Path:
    state = resume(run.models, run.ppo, run.log, run.models_cfg, run.out)
    rollout_sampler.sync_weights(run.models)  # vllm: the (resumed) actor's weights into the engine
    unsup = pretraining_mix(run, state)
    tracker, bar = open_tracker(run.log, state, run.plan.total, run.label, run.run_config)
    preemption.enter_training()
    g = run.generation
    while state.step < run.plan.total:
        metrics, ro, exp, prompt_texts = ppo_step(run, state, unsup)
        startup.first_step(log)
        # 6. log (every --log_interval steps and the last), evaluate and save
        if state.step % run.log.log_interval == 0 or state.step == run.plan.total:
            tracker.log(metrics, state.step)
        if run.eval_prompts is not None and eval_due(run.log, state.step, run.plan.total):
            log_eval(evaluate_policy(run, state.step), state.step, tracker, log)
        bar.update(1)
        bar.set_postfix(
            score=f"{metrics['objective/score']:.3f}",
            kl=f"{metrics['objective/kl']:.3f}",
            macro=f"{metrics['macro/mean_len']:.1f}",
        )
        if g.print_answers and is_main() and state.step % g.print_answers_interval == 0:
            print_answer(run.tokenizer, ro, exp, prompt_texts)
        save_steps = run.log.save_steps
        saved = save_steps and state.step % save_steps == 0
        if saved and state.step < run.plan.total:
            save_run(run, state, final=False)
        stop_if_requested(run, state, tracker, bar, saved)
    bar.close()
    save_run(run, state, final=True)
    tracker.close()
    if run.rewarder is not None:
        run.rewarder.close()
    if is_main():
        log.info("%s actor saved to %s", run.label, run.out / "actor")
    rollout_sampler.close(run.models)  # last: vLLM's teardown ends the process group
    return run.out


def save_run(run: Run, state: TrainState, final: bool, models_too: bool = True) -> None:
    """:func:`~marlhf.stages.ppo.state.save_checkpoint` of the run after ``state.step`` steps."""
    save_checkpoint(
        run.models, state, run.tokenizer, run.log, run.models_cfg, run.run_config, final,
        run.settings, models_too=models_too,
    )  # fmt: skip


def stop_if_requested(run: Run, state: TrainState, tracker, bar, saved: bool) -> None:
    """After a step: when any rank got SIGTERM or SIGINT (a collective), save the training state
    (unless this step's checkpoint was just saved) and raise
    :class:`marlhf.runtime.preemption.StoppedBySignal`."""
    signum = preemption.stop_requested()
    if not signum or state.step >= run.plan.total:
        return
    if not saved:  # the training state only: what a resume needs, soonest
        save_run(run, state, final=False, models_too=False)
    bar.close()
    tracker.close()
    state_root = run.out / "train_state"
    message = preemption.stop_message(signum, state.step, run.plan.total, state_root)
    raise preemption.StoppedBySignal(signum, message)


def ppo_step(run: Run, state: TrainState, unsup=None):
    """One PPO step: returns its metrics (over all ranks), this rank's rollout, the experience
    (global batch) and this rank's prompt texts."""
    ppo, plan, perf = run.ppo, run.plan, run.perf
    clock = _Clock(PhaseResources() if perf.log_phase_resources else None)
    t = time.perf_counter()
    # the update's first minibatch: its critic pass is run once, while scoring, and kept for it
    first = None
    if reuses_critic_forward(run.models, perf):
        first = first_minibatch_rows(plan.rollout_size * plan.world, ppo, state.shuffle)
    # 1. generate, 2. score (the forward passes), one generation batch at a time
    check = mismatch_check_step(perf, state.step)
    env_metrics: dict[str, float] = {}
    played = None  # --env: the episodes (macro_mc continues them)
    if run.env is None:
        ro, scored, metas, prompt_texts = collect_rollouts(run, state.step, clock, first, check)
    else:  # --env: multi-turn episodes, laid out as a rollout of their actions
        ro, scored, metas, prompt_texts, env_metrics, played = collect_episodes(
            run, state.step, clock, first, check
        )
    kept = None
    if first is not None:
        with clock("time/score"):
            scored, kept = kept_critic_values(run.models, ro, scored, first, perf)
    # 2. the sequence-level reward: RM score (normalised if asked), execution reward, gold oracle
    with clock("time/code_reward" if run.rewarder is not None else None):
        if run.env is None:
            scores, code_metrics = run.reward(ro, scored.rm_scores, metas, prompt_texts)
        else:  # the environment's rewards come per turn (ro.turn_rewards)
            scores, code_metrics = env_scores(run, ro, scored, metas, prompt_texts)
    # per-row randomness is drawn from (seed, step, the row's global index): split-independent, and
    # a resumed run redraws it without a saved generator state (streams 0 segments, 1 dense rewards)
    rows = global_rows(len(ro.prompt_ids), plan.generation_batch, rank(), plan.world)
    dense = None
    if ppo.dense_reward:
        dense_seeds = derive_row_seeds(ppo.optim.seed, state.step, rows, stream=1)
        dense = dense_rewards(run.seg_rule, run.seg_norm, ro, scored, ppo, dense_seeds)
    with clock("time/macro"):
        # 3. segment: macro actions, per-token rewards
        seeds = derive_row_seeds(ppo.optim.seed, state.step, rows)
        term, exp = make_experience(
            run.rule, ro, scored, scores, ppo, state.kl_ctl.value,
            row_seeds=seeds, dense=dense, all_gather=all_gather_padded,
        )  # fmt: skip
    mc_stats: dict[str, float] = {}
    if ppo.needs_mc:  # macro_mc: values at macro-action boundaries from continuations
        with clock("time/mc"):
            ctx = Continuations(
                run.models, ppo, run.generation, run.tokenizer, run.eos_ids, run.reward, state.step
            )
            if run.env is None:
                exp, mc_stats = monte_carlo(ctx, exp, rows, metas, prompt_texts)
            else:  # continuations from turn boundaries, replaying the environment's steps
                exp, mc_stats = env_monte_carlo(ctx, run.env, exp, rows, played)
    with clock("time/macro"):
        # the global batch on every rank, then 4. estimate: advantages (and returns)
        exp = gather_experience(exp, run.tokenizer.pad_token_id, plan.generation_batch)
        exp = estimate(exp, term, ppo, run.macro)
    # the step's numbers, before anything reaches the weights (the global batch: every rank alike)
    check_experience(exp, state.step + 1)
    # 5. update
    with clock("time/train"):
        train_actor = state.step >= ppo.critic_warmup_steps
        # the rates this update is taken with (read before the engines step)
        lrs = {f"lr/{k}": e.get_lr()[0] for k, e in _trained(run.models).items()}
        rollout_sampler.sleep(run.models)  # vllm on a GPU: the engine's memory is the update's
        upd = ppo_update(
            run.models,
            exp,
            run.trainer,
            train_actor,
            state.shuffle,
            unsup if train_actor else None,
            kept,
            step=state.step + 1,
        )
        if state.ema is not None and train_actor:
            state.ema.update(run.models.actor.module)
    with clock("time/sync" if run.models.sampler.needs_weight_sync else None):
        rollout_sampler.sync_weights(run.models)  # vllm: the updated actor into the engine
    clock.times["time/step"] = time.perf_counter() - t
    state.step += 1
    # the KL coefficient of the next step (adaptive: towards --target_kl)
    kl_now = float(all_reduce_mean(torch.tensor(exp.stats["objective/kl"])))
    state.kl_ctl.update(kl_now, plan.rollout_size * plan.world)
    # 6. metrics (the loop logs them)
    metrics = {**exp.stats, **upd, **clock.times, **clock.resources_metrics(), **code_metrics}
    metrics.update(mc_stats)
    metrics.update(env_metrics)
    if exp.trainer_logprobs is not None:  # the trainer scored the rollout's record
        mask, seg = exp.rollout.action_mask, exp.segment_ids
        metrics.update(mismatch_metrics(exp.trainer_logprobs, exp.rollout_logprobs, mask, seg))
        if exp.rollout.turn_index is not None:  # and per turn
            turns = exp.rollout.turn_index
            trainer, record = exp.trainer_logprobs, exp.rollout_logprobs
            metrics.update(turn_mismatch_metrics(trainer, record, mask, turns))
    metrics = step_metrics(run, state, metrics, ro, scored, scores, exp, prompt_texts)
    return {**metrics, **lrs}, ro, exp, prompt_texts


def step_metrics(
    run: Run,
    state: TrainState,
    metrics: dict,
    ro: Rollout,
    scored: Scored,
    scores: torch.Tensor,
    exp: Experience,
    prompt_texts: list[str],
) -> dict[str, float]:
    """``metrics`` with the step's score (with ``--env``, the episodes' total reward), KL
    coefficient, critic and gold metrics, averaged over
    ranks. ``metrics`` (experience and update stats) are over the global batch already (the same on
    every rank); the row means of this rank's rows (score, gold) average over ranks (equal counts)."""
    raw_rm = scored.rm_scores
    metrics["objective/score"] = (
        float(raw_rm.mean()) if raw_rm is not None else float(scores.mean())
    )
    if ro.turn_rewards is not None:  # --env: the episodes' total reward
        metrics["objective/score"] = float((scores + ro.turn_rewards.sum(1)).mean())
    metrics["objective/kl_coef"] = state.kl_ctl.value
    if run.models.critic is not None:
        metrics.update(critic_metrics(exp))
    if run.gold is not None:
        texts = run.tokenizer.batch_decode(ro.response_ids, skip_special_tokens=True)
        metrics["objective/gold"] = sum(
            run.gold(p, r) for p, r in zip(prompt_texts, texts, strict=True)
        ) / len(texts)
    return {k: float(all_reduce_mean(torch.tensor(float(v)))) for k, v in sorted(metrics.items())}


def mismatch_check_step(perf: PerfConfig, step: int) -> bool:
    """Whether step ``step`` (0-based) checks the rollout's record of log π_old against the
    trainer's: the first step and every ``--mismatch_check_every``-th after it."""
    every = perf.mismatch_check_every
    return every > 0 and step % every == 0


def collect_rollouts(
    run: Run,
    step: int,
    clock: _Clock,
    later_values: torch.Tensor | None = None,
    check_rollout: bool = False,
):
    """1.–2. This rank's rollout of step ``step``, scored: ``--generation_batches`` calls of generate
    then score. ``later_values``: rows (of the concatenated rollout) whose critic values scoring
    leaves for :func:`~marlhf.stages.ppo.scoring.kept_critic_values`; ``check_rollout``: the
    actor also scores the decoder's record (:func:`~marlhf.stages.ppo.scoring.old_policy`).
    Returns the concatenated rollout and scores, the prompts' metas and texts."""
    plan, seed = run.plan, run.ppo.optim.seed
    rollouts, scoreds, metas = [], [], []
    # the static decoder (and vLLM) sample each row from (seed, step, its global row; stream 2,
    # apart from the termination's 0 and the dense rewards' 1): the rollouts do not depend on the
    # split over ranks, and a resumed run redraws them without a saved generator state
    micro = []
    for idx, sample_seeds, later in generation_batches(plan, seed, step, later_values):
        micro.append(idx)
        batch = run.collate([run.prompts[i] for i in idx])
        with clock("time/generate"):
            ro = generate(
                run.models.actor, run.models.sampler, batch, run.generation, run.tokenizer,
                run.eos_ids, row_seeds=sample_seeds,
            )  # fmt: skip
        with clock("time/score"):
            scoreds.append(
                score(run.models, ro, run.trainer, run.need_entropy, later, check_rollout)
            )
        rollouts.append(ro)
        metas.extend(prompt_metas(batch, len(idx)))
    prompt_texts = [t for idx in micro for t in (run.prompts[i]["prompt"] for i in idx)]
    ro = concat_rollouts(rollouts, run.tokenizer.pad_token_id)
    scored = concat_scored(scoreds, ro.sequences.shape[1], ro.response_ids.shape[1])
    return ro, scored, metas, prompt_texts


def _trained(models: Models) -> dict:
    """The engines the update trains: the actor, and the critic when there is one."""
    return {k: e for k, e in (("actor", models.actor), ("critic", models.critic)) if e is not None}


def critic_metrics(exp: Experience) -> dict[str, float]:
    """How well the critic's values (from scoring) predict the returns of this batch."""
    mask = exp.rollout.action_mask
    return {
        "value/explained_variance": explained_variance(exp.values, exp.returns, mask),
        "value/mean": float(masked_mean(exp.values, mask)),
    }


# --------------------------------------------------------------------------------------------------
# set-up


@dataclass(frozen=True)
class Run:
    """What the loop reads, built once by :func:`setup`: the built objects and the parts of the
    stage config the steps read (the config itself stays with :func:`setup`)."""

    out: Path
    tokenizer: PreTrainedTokenizerBase
    prompts: Dataset  # the tokenised PPO prompts
    collate: PromptCollator  # left-pads a list of prompts
    plan: RolloutPlan
    models: Models
    backend: str  # the rollouts' backend, --generation_backend resolved (models.sampler samples)
    rule: TerminationRule  # cuts responses into macro actions (--termination_condition)
    seg_rule: TerminationRule | None  # --dense_reward: the segment RM's own rule
    seg_norm: LocationNormalizer | None  # --dense_reward: its location normaliser
    need_entropy: bool  # a rule reads the reference's entropies
    eos_ids: list[int]
    gold: Callable[[str, str], float] | None  # the synthetic task's gold scorer (logged)
    rewarder: CodeRewarder | None  # the execution reward (--reward_source code / rm+code)
    reward: SequenceReward  # the sequence-level reward (--reward_source, --reward_fn, --reward_url)
    run_config: dict  # run_config.json: the config as it ran (the backend resolved)
    # the parts of the stage config the steps, evaluations and saves read
    ppo: PPOConfig
    generation: GenerationConfig
    macro: MacroConfig
    perf: PerfConfig
    log: LoggingConfig
    data: DataConfig  # the SFT data of --unsup_coef
    models_cfg: ActorCriticConfig  # the models' ZeRO stages (resume, save)
    trainer: TrainerSettings  # how the trainer scores and trains (PPOStageConfig.trainer)
    label: str  # what runs, in logs and trackers (run_label)
    settings: dict | None = None  # the run's settings, saved with each training state
    eval_prompts: Dataset | None = None  # the held-out prompts (with --eval_interval)
    env: EnvRollouts | None = None  # --env: the environment the episodes are played on


def setup(cfg: PPOStageConfig) -> Run:
    """Process group and seeds, tokenizer, prompts and plan, the four models, the termination
    rules and the reward sources; writes run_config.json and ds_config.json. The one function
    below :func:`train` that reads the whole config: it hands the run its parts."""
    models_cfg, g, ppo, data = cfg.models, cfg.generation, cfg.ppo, cfg.data
    start(models_cfg.ds, ppo.optim.seed, progress_bars=not cfg.log.disable_progress_bar)
    rollout_sampler.check_flags(g, models_cfg)  # before any data or model is loaded
    out = ensure_output_dir(cfg.log.output_dir)
    source = cfg.reward_source  # --reward_source, auto resolved
    check_seen_settings(models_cfg, source, data)  # the models see the texts they were trained on
    tokenizer = load_tokenizer(model_config(models_cfg, models_cfg.actor), padding_side="left")
    check_sources(source)
    check_context(ppo_model_roles(models_cfg, source), sequence_lengths(g, cfg.env))
    env = None
    if cfg.env.env is not None:  # multi-turn: the environment and the prompt rows it plays
        env = env_setup(cfg.env, tokenizer)
        prompts, dropped = load_env_rows(data.data_path, data.max_samples), 0
        check_first_prompt(env.layout, prompts, cfg.env.max_total_seq_len)
    else:
        prompts, dropped = load_prompts(data, g, ppo.optim.seed, source, tokenizer)
    custom = custom_rewards(cfg.reward)  # the user's functions load here: their errors come first
    if env is None:
        check_columns(custom, prompts["meta"])
    startup.mark("data")
    plan = plan_rollouts(len(prompts), g, ppo)
    # what ran (and what a resume compares): the config with --reward_source resolved
    ran = replace(cfg, ppo=replace(ppo, reward_source=source))
    settings = check_resume(flag_values(ran), cfg.log, global_sizes(plan, ppo))
    models = build_models(models_cfg, ppo, source, plan.total_updates, tokenizer)
    startup.mark("models + engines")
    backend = rollout_sampler.run_backend(g, models_cfg, models.actor)
    rule = build_termination(cfg.macro, tokenizer)
    # Segment-PPO's dense rewards cut responses with the segment RM's own rule: built once here
    seg_rule, seg_norm = segment_rule(models, tokenizer) if ppo.dense_reward else (None, None)
    need_entropy = "ref_entropy" in rule.needs or (
        seg_rule is not None and "ref_entropy" in seg_rule.needs
    )
    gold, rewarder = _reward_sources(source, data, cfg.code)
    score_stats = models.reward_info.get("score_stats") if models.reward_info else None
    ctx = RewardContext(gold, rewarder, ppo.normalize_reward, score_stats, cfg.reward.reward_errors)
    sources = build_sources(source_names(source), ctx) + custom
    # what ran: the config with the resolved backend (a copy; the config itself keeps `auto`)
    run_config = config_to_dict(replace(ran, generation=replace(g, generation_backend=backend)))
    label = run_label(ppo, cfg.macro)
    if is_main():
        write_json(out / "run_config.json", run_config)
        ds = {"actor": models.actor_ds, "critic": models.critic_ds}
        write_json(out / "ds_config.json", {k: v for k, v in ds.items() if v is not None})
        log.info(
            "%s: %d prompts (%d over-long %s), %d steps, rollout %d/device (%d sample(s) "
            "per prompt), termination=%s, estimator=%s",
            label,
            len(prompts),
            dropped,
            "dropped" if g.overlong_prompts == "drop" else "truncated",
            plan.total,
            plan.rollout_size,
            ppo.n_samples_per_prompt,
            cfg.macro.termination_condition,
            ppo.estimator,
        )
        if cfg.env.env is not None:
            extra = " and " + describe_reward(source, cfg.reward) if source != "none" else ""
            log.info("reward: the environment's, per turn (--env %s)%s", cfg.env.env, extra)
        else:
            log.info("reward: %s", describe_reward(source, cfg.reward))
    oracle = gold if "gold" in source_names(source) else None
    errors = cfg.reward.reward_errors
    eval_prompts = None
    if cfg.log.eval_interval > 0:
        eval_prompts = load_eval_prompts(data, g, ppo.optim.seed, tokenizer)
    run = Run(
        out=out,
        tokenizer=tokenizer,
        prompts=prompts,
        collate=PromptCollator(tokenizer.pad_token_id),
        plan=plan,
        models=models,
        backend=backend,
        rule=rule,
        seg_rule=seg_rule,
        seg_norm=seg_norm,
        need_entropy=need_entropy,
        eos_ids=eos_token_ids(tokenizer, data),
        gold=gold,
        rewarder=rewarder,
        reward=SequenceReward(tokenizer, ppo, rewarder, score_stats, oracle, sources, errors),
        run_config=run_config,
        # the config's parts
        ppo=ppo, generation=g, macro=cfg.macro, perf=cfg.perf, log=cfg.log, data=data,
        models_cfg=models_cfg, trainer=cfg.trainer, label=label,
        settings=settings,
        eval_prompts=eval_prompts,
        env=env,
    )  # fmt: skip
    # last: the sampler, once per run (an engine of its own gets the weights from `train`)
    models.sampler = rollout_sampler.open_run_sampler(
        g, ppo, models_cfg, plan, models.actor, backend
    )
    return run


def sequence_lengths(g: GenerationConfig, env: EnvConfig) -> dict[str, int]:
    """The flags whose sum is the longest sequence a PPO model reads (prompt + response; with
    ``--env``, the whole conversation)."""
    if env.env is not None:
        return {"--max_total_seq_len": env.max_total_seq_len}
    return {
        "--max_prompt_seq_len": g.max_prompt_seq_len,
        "--max_answer_seq_len": g.max_answer_seq_len,
    }


def global_sizes(plan: RolloutPlan, ppo: PPOConfig) -> dict[str, int]:
    """The sizes a resumed run must keep whatever its number of processes: responses per step and
    rows per minibatch, over all ranks."""
    return {
        "rollout_batch": plan.rollout_size * plan.world,
        "minibatch": ppo.per_device_training_batch_size * plan.world,
    }


def _reward_sources(source: str, data: DataConfig, code: CodeRewardConfig):
    """The gold scorer (or None: the data are no synthetic task) and the code rewarder (or None)
    of ``source`` (``--reward_source`` resolved)."""
    rewarder = None
    if "code" in source_names(source):
        rewarder = CodeRewarder.from_config(code)
    return gold_scorer(data), rewarder


def pretraining_mix(run: Run, state: TrainState):
    """The SFT batches of ``--unsup_coef`` (None without it); a resumed run skips those consumed."""
    ppo = run.ppo
    if ppo.unsup_coef <= 0:
        return None
    minibatches = run.plan.rollout_size // ppo.per_device_training_batch_size
    consumed = max(0, state.step - ppo.critic_warmup_steps) * ppo.ppo_epochs * minibatches
    return sft_batches(run.data, ppo, run.tokenizer, skip=consumed)


class _Clock:
    """Seconds per phase of a step, summed over its calls: ``with clock("time/score"): ...``; with
    ``resources`` (``--log_phase_resources``) also each phase's CPU time and peak memory."""

    def __init__(self, resources: PhaseResources | None = None) -> None:
        self.times: dict[str, float] = {}
        self.resources = resources
        self.cpu0 = time.process_time()

    @contextmanager
    def __call__(self, key: str | None):
        if self.resources is not None and key is not None:
            self.resources.start()
        t0 = time.perf_counter()
        yield
        if key is not None:
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t0
            if self.resources is not None:
                self.resources.stop(key.split("/", 1)[1])

    def resources_metrics(self) -> dict[str, float]:
        """The phases' resource metrics and ``time_cpu/step`` (CPU seconds since the clock began)."""
        if self.resources is None:
            return {}
        return {**self.resources.metrics, "time_cpu/step": time.process_time() - self.cpu0}


def print_answer(tokenizer, ro: Rollout, exp: Experience, prompts: list[str]) -> None:
    """The first response of the step, its macro actions marked with ``|``."""
    n = int(ro.action_mask[0].sum())
    ids = ro.response_ids[0, :n].tolist()
    ends = (exp.segment_ids[0, :n] != torch.roll(exp.segment_ids[0, :n], -1)).tolist()
    ends[-1] = True
    print(
        f"\n--- prompt ---\n{prompts[0]}\n--- response (| = macro-action boundary), "
        f"score {float(exp.scores[0]):.3f} ---"
    )
    print(render_terminal(token_pieces(tokenizer, ids), ends))
