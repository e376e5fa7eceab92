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
from pathlib import Path

import torch

from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
from marlhf.distributed import is_main
from marlhf.engine import build_eval_engine, build_train_engine, ds_config
from marlhf.models import apply_lora, load_causal_lm, resolve_model_path
from marlhf.rl.config import ActorCriticConfig, PPOConfig, PPOStageConfig

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
log = logging.getLogger("marlhf.ppo")


@dataclass
class Models:
    actor: object  # DeepSpeed engine (causal LM, possibly peft)
    critic: object | None  # DeepSpeed engine (RewardModel); None for a critic-free estimator
    ref: object  # DeepSpeed engine, frozen
    reward: object | None  # DeepSpeed engine, frozen RewardModel (None with --reward_source code)
    reward_info: dict  # the reward model's reward_config.json ({} when there is none)
    actor_ds: dict  # the actor's DeepSpeed config (saved as ds_config.json)
    critic_ds: dict | None  # the critic's DeepSpeed config (None without a critic)
    rollout: object | None = None  # the vLLM engine (--generation_backend vllm), else None


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


def _model_cfg(
    cfg: ActorCriticConfig, path: str, dropout, ckpt: bool, lora_dim: int, lora_name: str
) -> ModelConfig:
    return ModelConfig(
        model_name_or_path=path,
        trust_remote_code=cfg.trust_remote_code,
        dtype=cfg.effective_dtype,
        gradient_checkpointing=ckpt,
        dropout=dropout,
        lora_dim=lora_dim,
        lora_module_name=lora_name,
        only_optimize_lora=cfg.only_optimize_lora and lora_dim > 0,
    )


def _optim(ppo: PPOConfig, lr: float, wd: float, micro: int) -> OptimConfig:
    return OptimConfig(
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=ppo.gradient_accumulation_steps,
        learning_rate=lr,
        weight_decay=wd,
        max_grad_norm=ppo.max_grad_norm,
        lr_scheduler_type=ppo.lr_scheduler_type,
        num_warmup_steps=ppo.num_warmup_steps,
        warmup_ratio=ppo.warmup_ratio,
        seed=ppo.seed,
    )


def _ds(mc: ActorCriticConfig, stage: int) -> DeepSpeedConfig:
    return DeepSpeedConfig(
        zero_stage=stage, offload=mc.offload, deepspeed_config=mc.deepspeed_config
    )


def actor_model_config(mc: ActorCriticConfig) -> ModelConfig:
    """How the actor is loaded (the reference shares it, minus LoRA, checkpointing and dropout)."""
    return _model_cfg(
        mc,
        mc.actor_model_name_or_path,
        mc.actor_dropout,
        mc.actor_gradient_checkpointing,
        mc.actor_lora_dim,
        mc.actor_lora_module_name,
    )


def build_actor(cfg: PPOStageConfig, total_updates: int) -> tuple[object, dict]:
    """The SFT policy as a trainable engine, and its DeepSpeed config."""
    mc, ppo = cfg.models, cfg.ppo
    micro = ppo.per_device_training_batch_size
    actor_cfg = actor_model_config(mc)
    # ZeRO-3: load the weights partitioned across ranks (transformers reads only the ZeRO section)
    zero3 = (
        ds_config(zero_stage=3, dtype=mc.effective_dtype, micro_batch_size=micro, inference=True)
        if mc.actor_zero_stage == 3
        else None
    )
    actor = apply_lora(load_causal_lm(actor_cfg, ds_zero3_config=zero3), actor_cfg)
    return build_train_engine(
        actor,
        model_cfg=actor_cfg,
        ds=_ds(mc, mc.actor_zero_stage),
        optim=_optim(ppo, ppo.actor_learning_rate, ppo.actor_weight_decay, micro),
        total_steps=total_updates,
        micro_batch_size=micro,
    )


def build_reference(cfg: PPOStageConfig) -> object:
    """The reference policy: the same SFT weights (or --reference_model_name_or_path), frozen."""
    mc = cfg.models
    ref_cfg = replace(
        actor_model_config(mc),
        model_name_or_path=mc.reference_model_name_or_path or mc.actor_model_name_or_path,
        lora_dim=0,
        only_optimize_lora=False,
        gradient_checkpointing=False,
        dropout=0.0,
    )
    engine, _ = build_eval_engine(
        load_causal_lm(ref_cfg),
        dtype=mc.effective_dtype,
        zero_stage=mc.actor_zero_stage,
        offload=mc.offload_reference_model,
    )
    return engine


def _load_critic(cfg: PPOStageConfig):
    """The critic's module (a RewardModel) and the reward_config.json it came with ({} if none)."""
    from marlhf.reward_model import RewardModel, load_reward_model

    mc = cfg.models
    dtype = _DTYPES[mc.effective_dtype]
    critic_path = mc.critic_model_name_or_path or mc.actor_model_name_or_path
    if (Path(critic_path) / "reward_config.json").exists():
        return load_reward_model(critic_path, dtype=dtype)
    if cfg.ppo.reward_source == "code":
        # no reward-model stage (code generation, APPS): the critic starts from the policy's backbone
        # with a fresh value head
        return RewardModel.from_pretrained(resolve_model_path(critic_path), dtype=dtype), {}
    raise ValueError(
        f"--critic_model_name_or_path {critic_path!r} is not a reward-model directory (no "
        "reward_config.json); pass the output of stage 2"
    )


def build_critic(cfg: PPOStageConfig, total_updates: int) -> tuple[object, dict, dict]:
    """The critic as a trainable engine (initialised from the reward model), its DeepSpeed config
    and the reward_config.json it was loaded from."""
    mc, ppo = cfg.models, cfg.ppo
    micro = ppo.per_device_training_batch_size
    critic, info = _load_critic(cfg)
    if mc.critic_dropout is not None:
        from marlhf.models import set_model_dropout

        set_model_dropout(critic, mc.critic_dropout)
    if mc.critic_gradient_checkpointing:
        critic.gradient_checkpointing_enable({"use_reentrant": False})
    if mc.critic_lora_dim:
        critic_lora = _model_cfg(
            mc, "", None, False, mc.critic_lora_dim, mc.critic_lora_module_name
        )
        critic.backbone = apply_lora(critic.backbone, critic_lora)
    engine, critic_ds = build_train_engine(
        critic,
        model_cfg=actor_model_config(mc),
        ds=_ds(mc, mc.critic_zero_stage),
        optim=_optim(ppo, ppo.critic_learning_rate, ppo.critic_weight_decay, micro),
        total_steps=total_updates,
        micro_batch_size=micro,
    )
    return engine, critic_ds, info


def build_reward(cfg: PPOStageConfig, critic_info: dict) -> tuple[object | None, dict]:
    """The frozen reward model's engine (None unless --reward_source uses it) and its
    reward_config.json (``critic_info`` when there is no reward model)."""
    from marlhf.reward_model import RewardModel, load_reward_model

    mc = cfg.models
    if cfg.ppo.reward_source not in ("rm", "rm+code"):
        return None, critic_info
    reward, info = load_reward_model(
        mc.reward_model_name_or_path or mc.critic_model_name_or_path,
        dtype=_DTYPES[mc.effective_dtype],
    )
    assert isinstance(reward, RewardModel)
    engine, _ = build_eval_engine(reward, dtype=mc.effective_dtype, zero_stage=mc.critic_zero_stage)
    return engine, info


def build_models(cfg: PPOStageConfig, total_updates: int) -> Models:
    """Actor, reference, critic and reward model, in that order (each may draw from the RNG:
    LoRA and fresh value heads are initialised randomly). The four share one tokenizer: checked
    before any weights are loaded (`marlhf.preflight.check_same_tokenizer`). The critic only when
    the estimator reads one (``--advantage_estimator gae``)."""
    from marlhf.preflight import check_same_tokenizer, ppo_model_roles

    roles = ppo_model_roles(cfg.models, cfg.ppo.reward_source)
    check_same_tokenizer(roles, trust_remote_code=cfg.models.trust_remote_code)
    actor, actor_ds = build_actor(cfg, total_updates)
    ref = build_reference(cfg)
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
    return Models(actor, critic, ref, reward, reward_info, actor_ds, critic_ds)
