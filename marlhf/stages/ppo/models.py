"""The four models of stage 3, as DeepSpeed engines.

The actor (from SFT) and the critic (from the reward model) train; the reference (frozen SFT) and
the reward model (frozen RM) only run forward. The critic is built by :func:`build_critic` alone,
so a critic-free estimator only has to skip that call.

Dropout. Experience (old log-probs, values, entropies, reward scores) is computed with dropout off
(:func:`eval_mode`; the reference and reward model are frozen in eval mode), so at the first step,
where the actor is the reference, the KL is 0. During the update the actor and critic train with
``--actor_dropout`` / ``--critic_dropout``, 0 by default (TRL and OpenRLHF disable dropout in RLHF
too): with dropout on, the ratio of the first minibatch would not be 1 and the clipping would act on
dropout noise. ``none`` keeps a model's own dropout.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
from marlhf.models.checks import (
    check_same_tokenizer,
    critic_head,
    critic_problem,
    is_reward_dir,
    model_flag,
    ppo_model_roles,
    settings_mismatches,
)
from marlhf.models.generation import GenerationBackend
from marlhf.models.load import load_causal_lm, resolve_model_path, set_model_dropout
from marlhf.models.lora import apply_lora, log_parameter_counts, wrap_lora
from marlhf.models.reward_model import RewardModel, load_reward_model
from marlhf.rewards.registry import reads_reward_model
from marlhf.runtime.distributed import is_main
from marlhf.runtime.engine import build_eval_engine, build_train_engine, ds_config
from marlhf.stages.ppo.config import (
    ActorCriticConfig,
    PPOConfig,
    PPOStageConfig,
    TrainedModelConfig,
)

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
log = logging.getLogger("marlhf.ppo")


@dataclass
class Models:
    actor: object  # DeepSpeed engine (causal LM, possibly peft)
    critic: object | None  # DeepSpeed engine (RewardModel); None for a critic-free estimator
    ref: object  # DeepSpeed engine, frozen
    reward: object | None  # DeepSpeed engine, frozen RewardModel (None unless --reward_source rm)
    reward_info: dict  # the reward model's reward_config.json ({} when there is none)
    actor_ds: dict  # the actor's DeepSpeed config (saved as ds_config.json)
    critic_ds: dict | None  # the critic's DeepSpeed config (None without a critic)
    # the rollout sampler (--generation_backend, marlhf.stages.ppo.sampler), opened after the engines
    sampler: GenerationBackend | None = None


@contextmanager
def eval_mode(*engines):
    """Dropout off inside the block (each engine's module in eval mode); each engine's mode before
    the block is restored after it."""
    modes = [engine.module.training for engine in engines]
    for engine in engines:
        engine.eval()
    try:
        yield
    finally:
        for engine, mode in zip(engines, modes, strict=True):
            engine.train(mode)


def model_config(mc: ActorCriticConfig, m: TrainedModelConfig) -> ModelConfig:
    """How a trained model (``mc.actor`` or ``mc.critic``) is loaded: its own settings (path,
    dropout, checkpointing, LoRA) with those the four models share (``--dtype``, ...)."""
    return replace(
        m.model,
        trust_remote_code=mc.shared.trust_remote_code,
        dtype=mc.effective_dtype,
        only_optimize_lora=mc.shared.only_optimize_lora and m.model.lora_dim > 0,
        lora_train_base=mc.shared.lora_train_base and m.model.lora_dim > 0,
    )


def optim_config(ppo: PPOConfig, m: TrainedModelConfig) -> OptimConfig:
    """A trained model's optimizer: PPO's shared schedule with the model's own learning rate and
    weight decay, on minibatches of ``--per_device_training_batch_size``."""
    return replace(
        ppo.optim,
        per_device_train_batch_size=ppo.per_device_training_batch_size,
        learning_rate=m.optim.learning_rate,
        weight_decay=m.optim.weight_decay,
    )


def ds_config_of(mc: ActorCriticConfig, m: TrainedModelConfig) -> DeepSpeedConfig:
    """A trained model's DeepSpeed settings: the shared ones with the model's ZeRO stage."""
    return replace(mc.ds, zero_stage=m.ds.zero_stage)


def actor_model_config(mc: ActorCriticConfig) -> ModelConfig:
    """How the actor is loaded (the reference shares it, minus LoRA, checkpointing and dropout)."""
    return model_config(mc, mc.actor)


def build_actor(cfg: PPOStageConfig, total_updates: int) -> tuple[object, dict]:
    """The SFT policy as a trainable engine, and its DeepSpeed config."""
    mc, ppo = cfg.models, cfg.ppo
    micro = ppo.per_device_training_batch_size
    actor_cfg = actor_model_config(mc)
    # ZeRO-3: load the weights partitioned across ranks (transformers reads only the ZeRO section)
    zero3 = (
        ds_config(zero_stage=3, dtype=mc.effective_dtype, micro_batch_size=micro, inference=True)
        if mc.actor.ds.zero_stage == 3
        else None
    )
    actor = apply_lora(load_causal_lm(actor_cfg, ds_zero3_config=zero3), actor_cfg, "actor")
    return build_train_engine(
        actor,
        model_cfg=actor_cfg,
        ds=ds_config_of(mc, mc.actor),
        optim=optim_config(ppo, mc.actor),
        total_steps=total_updates,
        micro_batch_size=micro,
    )


def build_reference(mc: ActorCriticConfig) -> object:
    """The reference policy: the same SFT weights (or --reference_model_name_or_path), frozen."""
    ref_cfg = replace(
        actor_model_config(mc),
        model_name_or_path=mc.reference_model_name_or_path or mc.actor.model.model_name_or_path,
        lora_dim=0,
        only_optimize_lora=False,
        lora_train_base=False,
        gradient_checkpointing=False,
        dropout=0.0,
    )
    engine, _ = build_eval_engine(
        load_causal_lm(ref_cfg),
        dtype=mc.effective_dtype,
        zero_stage=mc.actor.ds.zero_stage,
        offload=mc.offload_reference_model,
    )
    return engine


def _load_critic(cfg: PPOStageConfig):
    """The critic's module (a RewardModel) and the reward_config.json it came with ({} if none):
    a reward model's backbone and value head, or with a fresh value head
    (:func:`marlhf.models.checks.critic_head`: ``--critic_value_head``)."""
    mc = cfg.models
    dtype = _DTYPES[mc.effective_dtype]
    critic_path = mc.critic.model.model_name_or_path or mc.actor.model.model_name_or_path
    problem = critic_problem(mc, cfg.reward_source)
    if problem:
        raise ValueError(problem)
    head = critic_head(mc, cfg.reward_source)
    if is_reward_dir(critic_path):
        critic, info = load_reward_model(critic_path, dtype=dtype)
        if head == "fresh":
            critic.reset_value_head()
    else:
        critic, info = RewardModel.from_pretrained(resolve_model_path(critic_path), dtype=dtype), {}
    if head == "fresh" and is_main():
        log.info("critic: the backbone of %s with a fresh value head", critic_path)
    return critic, info


def build_critic(cfg: PPOStageConfig, total_updates: int) -> tuple[object, dict, dict]:
    """The critic as a trainable engine (initialised from the reward model), its DeepSpeed config
    and the reward_config.json it was loaded from."""
    mc, ppo = cfg.models, cfg.ppo
    micro = ppo.per_device_training_batch_size
    critic, info = _load_critic(cfg)
    if mc.critic.model.dropout is not None:
        set_model_dropout(critic, mc.critic.model.dropout)
    if mc.critic.model.gradient_checkpointing:
        critic.gradient_checkpointing_enable({"use_reentrant": False})
    critic_lora = replace(
        model_config(mc, mc.critic), model_name_or_path="", dropout=None,
        gradient_checkpointing=False,
    )  # fmt: skip
    critic.backbone, lora = wrap_lora(critic.backbone, critic_lora)
    log_parameter_counts(critic, f"critic (value head included){lora}")
    engine, critic_ds = build_train_engine(
        critic,
        model_cfg=actor_model_config(mc),
        ds=ds_config_of(mc, mc.critic),
        optim=optim_config(ppo, mc.critic),
        total_steps=total_updates,
        micro_batch_size=micro,
    )
    return engine, critic_ds, info


def build_reward(cfg: PPOStageConfig, critic_info: dict) -> tuple[object | None, dict]:
    """The frozen reward model's engine (None unless --reward_source uses it) and its
    reward_config.json (``critic_info`` when there is no reward model)."""
    mc, source = cfg.models, cfg.reward_source
    if not reads_reward_model(source):
        return None, critic_info
    name = mc.reward_model_name_or_path or mc.critic.model.model_name_or_path
    if not name:
        raise ValueError(
            f"--reward_source {source} needs a reward model: pass the output of "
            "stage 2 as --reward_model_name_or_path"
        )
    if not is_reward_dir(name):
        raise ValueError(
            f"{model_flag(mc, 'reward')}: not a reward-model directory (no reward_config.json); "
            f"--reward_source {source} needs one: pass the output of stage 2 as "
            "--reward_model_name_or_path"
        )
    reward, info = load_reward_model(name, dtype=_DTYPES[mc.effective_dtype])
    assert isinstance(reward, RewardModel)
    engine, _ = build_eval_engine(
        reward, dtype=mc.effective_dtype, zero_stage=mc.critic.ds.zero_stage
    )
    return engine, info


def check_seen_settings(cfg: PPOStageConfig) -> None:
    """The models were trained on texts rendered as this run renders them
    (:func:`marlhf.models.checks.settings_mismatches`: ``--apply_chat_template``,
    ``--end_of_conversation_token``); a mismatch is refused, or with ``--allow_settings_mismatch``
    logged as a warning."""
    roles = ppo_model_roles(cfg.models, cfg.reward_source)
    problems = settings_mismatches(roles, vars(cfg.data))
    if not problems:
        return
    if not cfg.models.allow_settings_mismatch:
        raise ValueError(
            "; ".join(problems) + ". The model would see other texts than it learned on: pass "
            "the setting it was trained with, or --allow_settings_mismatch to train anyway"
        )
    if is_main():
        for problem in problems:
            log.warning("%s (--allow_settings_mismatch: training anyway)", problem)


def build_models(cfg: PPOStageConfig, total_updates: int, tokenizer: Any = None) -> Models:
    """Actor, reference, critic and reward model, in that order (each may draw from the RNG:
    LoRA and fresh value heads are initialised randomly). The four share one tokenizer: checked
    before any weights are loaded (`marlhf.models.checks.check_same_tokenizer`; ``tokenizer``, the
    actor's as the stage loaded it, is not loaded again). The critic only when the estimator reads
    one (``--advantage_estimator gae``)."""
    roles = ppo_model_roles(cfg.models, cfg.reward_source)
    # the stage's tokenizer is the one the check loads for the actor's directory (unless a
    # tokenizer is named apart from the model)
    own = cfg.models.actor.model
    loaded = (
        {own.model_name_or_path: tokenizer}
        if tokenizer is not None and not own.tokenizer_name_or_path
        else {}
    )
    check_same_tokenizer(
        roles, trust_remote_code=cfg.models.shared.trust_remote_code, loaded=loaded
    )
    actor, actor_ds = build_actor(cfg, total_updates)
    ref = build_reference(cfg.models)
    if cfg.ppo.needs_critic:
        critic, critic_ds, critic_info = build_critic(cfg, total_updates)
    else:
        critic, critic_ds, critic_info = None, None, {}
        if is_main():
            log.info(
                "no critic: --advantage_estimator %s needs none (none is built, trained or saved)",
                cfg.ppo.estimator,
            )
    reward, reward_info = build_reward(cfg, critic_info)
    return Models(
        actor=actor,
        critic=critic,
        ref=ref,
        reward=reward,
        reward_info=reward_info,
        actor_ds=actor_ds,
        critic_ds=critic_ds,
    )
