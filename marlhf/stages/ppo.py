"""Stage 3: MA-PPO — PPO whose advantages are estimated over macro actions (MA-RLHF, Alg. 1).

Four models: the actor (from SFT) and the critic (from the RM) train as DeepSpeed engines; the
reference (frozen SFT) and the reward model (frozen RM) only run forward. Each PPO step:

    1. rollout   — sample prompts, generate responses with the actor
    2. score     — log π_old, log π_ref (+ entropy), critic values, reward-model score
    3. macro     — termination rule → macro actions (``--termination_condition``)
    4. rewards   — r_t = −β·KL_t, + clipped score on the last response token (+ dense segment rewards)
    5. advantage — GAE over macro actions, broadcast to tokens (``--termination_condition fixed
                   --ngram 1`` is token-level PPO exactly)
    6. update    — ``--ppo_epochs`` × minibatches: clipped policy loss (token or macro ratio), clipped
                   value loss

Run::

    python -m marlhf.stages.ppo --actor_model_name_or_path out/sft --critic_model_name_or_path out/rm \
        --termination_condition fixed --ngram 5 --output_dir out/ppo
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from marlhf.batching import epoch_permutation, step_micro_batches, steps_per_epoch
from marlhf.checkpoint import (
    find_resume,
    gather_state_dict,
    load_train_state,
    rng_state,
    save_hf_causal_lm,
    save_train_state,
    set_rng_state,
    write_json,
)
from marlhf.cli import config_to_dict, parse_config
from marlhf.code_reward import CodeRewardConfig
from marlhf.config import DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.data.config import DataConfig
from marlhf.distributed import (
    all_gather_object,
    all_gather_padded,
    all_reduce_mean,
    all_reduce_sum,
    is_main,
    rank,
    world_size,
)
from marlhf.engine import build_eval_engine, build_train_engine, ds_config
from marlhf.losses import (
    entropy_bonus,
    explained_variance,
    masked_mean,
    masked_whiten,
    policy_loss,
    policy_terms,
    value_loss,
)
from marlhf.macro import MacroConfig, TerminationInputs, build_segments, build_termination
from marlhf.macro.estimate import macro_advantages, macro_stats
from marlhf.macro.termination import derive_row_seeds
from marlhf.models import apply_lora, load_causal_lm, load_tokenizer, resolve_model_path
from marlhf.ppo.config import ActorCriticConfig, GenerationConfig, PPOConfig
from marlhf.ppo.rollout import (
    Rollout,
    end_index,
    gather_response,
    pack_flush_left,
    response_logprobs_and_entropy,
    response_mask,
)
from marlhf.rewards import (
    AdaptiveKLController,
    FixedKLController,
    compose_rewards,
    kl_penalty,
    normalize_scores,
    spread_segment_rewards,
)
from marlhf.stages.common import ensure_output_dir, progress, start
from marlhf.tracking import Tracker

log = logging.getLogger("marlhf.ppo")


@dataclass
class PPOStageConfig:
    """Stage 3: MA-PPO (PPO over macro actions)."""

    models: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)
    data: DataConfig = field(default_factory=DataConfig)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)


@dataclass
class Experience:
    """A scored rollout with its macro actions, rewards and advantages (B rows).

    Under data parallelism it holds the global batch, every rank's rows on every rank in the order of
    one process with the whole batch (``gather_experience``).
    """

    rollout: Rollout
    old_logprobs: torch.Tensor  # (B, A) log π_old(a_t | s_t) at the sampling temperature
    ref_logprobs: torch.Tensor  # (B, A) log π_ref(a_t | s_t)
    values: torch.Tensor  # (B, A) critic V(s_t)
    scores: (
        torch.Tensor
    )  # (B,) reward before clipping (RM end score / code reward), after normalisation
    kl: torch.Tensor  # (B, A) per-token KL estimate
    rewards: torch.Tensor  # (B, A)
    advantages: torch.Tensor  # (B, A) macro advantage broadcast to its tokens
    returns: torch.Tensor  # (B, A)
    segment_ids: torch.Tensor  # (B, A) macro index of each token, -1 on padding
    entropy: torch.Tensor  # (B, A) entropy of π_old(· | s_t) at the sampling temperature
    fallback: torch.Tensor  # (B,) bool rows whose termination rule fell back to `fixed`
    stats: dict[str, float]


# --------------------------------------------------------------------------------------------------
# models


@dataclass
class Models:
    actor: object  # DeepSpeed engine (causal LM, possibly peft)
    critic: object  # DeepSpeed engine (RewardModel)
    ref: object  # DeepSpeed engine, frozen
    reward: object | None  # DeepSpeed engine, frozen RewardModel (None with --reward_source code)
    reward_info: dict
    actor_ds: dict
    critic_ds: dict


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


def build_models(cfg: PPOStageConfig, total_updates: int) -> Models:
    from marlhf.reward_model import RewardModel, load_reward_model

    mc, ppo = cfg.models, cfg.ppo
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        mc.effective_dtype
    ]
    micro = ppo.per_device_training_batch_size

    def _DS(stage: int) -> DeepSpeedConfig:
        return DeepSpeedConfig(
            zero_stage=stage, offload=mc.offload, deepspeed_config=mc.deepspeed_config
        )

    # actor: the SFT policy, trainable
    actor_cfg = _model_cfg(
        mc,
        mc.actor_model_name_or_path,
        mc.actor_dropout,
        mc.actor_gradient_checkpointing,
        mc.actor_lora_dim,
        mc.actor_lora_module_name,
    )
    # ZeRO-3: load the weights partitioned across ranks (transformers reads only the ZeRO section)
    zero3 = (
        ds_config(zero_stage=3, dtype=mc.effective_dtype, micro_batch_size=micro, inference=True)
        if mc.actor_zero_stage == 3
        else None
    )
    actor = apply_lora(load_causal_lm(actor_cfg, ds_zero3_config=zero3), actor_cfg)
    actor_engine, actor_ds = build_train_engine(
        actor,
        model_cfg=actor_cfg,
        ds=_DS(mc.actor_zero_stage),
        optim=_optim(ppo, ppo.actor_learning_rate, ppo.actor_weight_decay, micro),
        total_steps=total_updates,
        micro_batch_size=micro,
    )
    # reference: the same SFT weights, frozen
    ref_cfg = replace(
        actor_cfg,
        model_name_or_path=mc.reference_model_name_or_path or mc.actor_model_name_or_path,
        lora_dim=0,
        only_optimize_lora=False,
        gradient_checkpointing=False,
        dropout=0.0,
    )
    ref_engine, _ = build_eval_engine(
        load_causal_lm(ref_cfg),
        dtype=mc.effective_dtype,
        zero_stage=mc.actor_zero_stage,
        offload=mc.offload_reference_model,
    )
    # critic: initialised from the reward model, trainable
    critic_path = mc.critic_model_name_or_path or mc.actor_model_name_or_path
    if (Path(critic_path) / "reward_config.json").exists():
        critic, info = load_reward_model(critic_path, dtype=dtype)
    elif ppo.reward_source == "code":
        # no reward-model stage (code generation, APPS): the critic starts from the policy's backbone
        # with a fresh value head
        critic, info = RewardModel.from_pretrained(resolve_model_path(critic_path), dtype=dtype), {}
    else:
        raise ValueError(
            f"--critic_model_name_or_path {critic_path!r} is not a reward-model directory (no "
            "reward_config.json); pass the output of stage 2"
        )
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
    critic_engine, critic_ds = build_train_engine(
        critic,
        model_cfg=actor_cfg,
        ds=_DS(mc.critic_zero_stage),
        optim=_optim(ppo, ppo.critic_learning_rate, ppo.critic_weight_decay, micro),
        total_steps=total_updates,
        micro_batch_size=micro,
    )
    # reward model: frozen
    reward_engine = None
    reward_info = info
    if ppo.reward_source in ("rm", "rm+code"):
        reward, reward_info = load_reward_model(
            mc.reward_model_name_or_path or mc.critic_model_name_or_path, dtype=dtype
        )
        assert isinstance(reward, RewardModel)
        reward_engine, _ = build_eval_engine(
            reward, dtype=mc.effective_dtype, zero_stage=mc.critic_zero_stage
        )
    return Models(
        actor_engine, critic_engine, ref_engine, reward_engine, reward_info, actor_ds, critic_ds
    )


# --------------------------------------------------------------------------------------------------
# 1. rollout


def eos_token_ids(tokenizer, data: DataConfig) -> list[int]:
    """Generation stops at the tokenizer's EOS and at a single-token end-of-conversation token."""
    ids = [tokenizer.eos_token_id]
    if data.end_of_conversation_token:
        eot = tokenizer(data.end_of_conversation_token, add_special_tokens=False)["input_ids"]
        if len(eot) == 1 and eot[0] not in ids:
            ids.append(eot[0])
    return ids


def _zero3_gather(engine, enabled: bool):
    if not enabled or engine.zero_optimization_stage() != 3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


@torch.no_grad()
def generate(
    models: Models,
    batch: dict,
    cfg: PPOStageConfig,
    tokenizer,
    eos_ids: list[int],
    row_seeds: torch.Tensor | None = None,
) -> Rollout:
    """Sample one response per prompt of ``batch`` with the actor.

    ``row_seeds`` ((B,) long, static backend only): the static decoder's counter-based noise, so each
    row's response depends on its seed and prompt, not on the rows beside it; ``None`` draws from the
    global RNG. The ``hf`` backend (``model.generate``) always draws from the global RNG, one stream
    per rank, and left-pads to the local batch: its samples depend on how the batch is split."""
    g = cfg.generation
    actor = models.actor
    device = actor.device
    prompt_ids = batch["input_ids"].to(device)
    prompt_mask = batch["attention_mask"].to(device)
    zero3 = actor.zero_optimization_stage() == 3
    actor.eval()
    with _zero3_gather(actor, g.enable_zero3_generation_gather):
        if g.generation_backend == "static":
            from marlhf.decode import sample

            response_ids = sample(
                actor.module,
                prompt_ids,
                prompt_mask,
                max_new_tokens=g.max_answer_seq_len,
                temperature=g.temperature,
                top_k=g.top_k,
                top_p=g.top_p,
                eos_ids=eos_ids,
                pad_id=tokenizer.pad_token_id,
                row_seeds=row_seeds,  # None: the global RNG, seeded and restored on resume
                compile=g.compile_generation,
                prompt_bucket=g.max_prompt_seq_len,
            )
        else:
            out = actor.module.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                do_sample=True,
                temperature=g.temperature,
                top_k=g.top_k if g.top_k > 0 else None,
                top_p=g.top_p,
                max_new_tokens=g.max_answer_seq_len,
                eos_token_id=eos_ids,
                pad_token_id=tokenizer.pad_token_id,
                synced_gpus=zero3 and not g.enable_zero3_generation_gather and world_size() > 1,
                use_cache=True,
            )
            response_ids = out[:, prompt_ids.shape[1] :]
    actor.train()
    if response_ids.shape[1] == 0:  # every row produced nothing: keep one (padding) column
        response_ids = torch.full((prompt_ids.shape[0], 1), tokenizer.pad_token_id, device=device)
    action_mask, ends = response_mask(response_ids, eos_ids)
    response_ids = response_ids.masked_fill(~action_mask, tokenizer.pad_token_id)
    seq, att, start = pack_flush_left(
        prompt_ids, prompt_mask, response_ids, action_mask, tokenizer.pad_token_id
    )
    return Rollout(seq, att, start, response_ids, action_mask, ends, list(batch["prompt_id"]))


# --------------------------------------------------------------------------------------------------
# 2. score


def policy_forward(engine, ro: Rollout, temperature: float, *, with_entropy: bool = False):
    """(logprobs (B, A), entropy (B, A) | None) of the response tokens under ``engine``'s policy."""
    logits = engine(
        input_ids=ro.sequences, attention_mask=ro.attention_mask.long(), use_cache=False
    ).logits
    logits = logits / temperature
    return response_logprobs_and_entropy(
        logits, ro.sequences, ro.response_start, ro.response_ids.shape[1], with_entropy=with_entropy
    )


def critic_forward(engine, ro: Rollout) -> torch.Tensor:
    """V(s_j) for every response token j: the value at the position just before it. (B, A)"""
    values = engine(input_ids=ro.sequences, attention_mask=ro.attention_mask.long())
    return gather_response(values, ro.response_start, ro.response_ids.shape[1])


@torch.no_grad()
def score(
    models: Models, ro: Rollout, cfg: PPOStageConfig, need_entropy: bool
) -> dict[str, torch.Tensor]:
    T = cfg.generation.temperature
    old_logp, entropy = policy_forward(models.actor, ro, T, with_entropy=True)
    ref_logp, ref_ent = policy_forward(models.ref, ro, T, with_entropy=need_entropy)
    values = critic_forward(models.critic, ro)
    out = {
        "old_logprobs": old_logp,
        "entropy": entropy,
        "ref_logprobs": ref_logp,
        "ref_entropy": ref_ent,
        "values": values,
    }
    if models.reward is not None:
        rm_values = models.reward(input_ids=ro.sequences, attention_mask=ro.attention_mask.long())
        out["rm_values"] = rm_values
        out["scores"] = torch.gather(
            rm_values, 1, end_index(ro.attention_mask).unsqueeze(1)
        ).squeeze(1)
    return out


# --------------------------------------------------------------------------------------------------
# 3.–5. macro actions, rewards, advantages (pure given the scored rollout)


def make_experience(
    ro: Rollout,
    scored: dict[str, torch.Tensor],
    scores: torch.Tensor,
    rule,
    cfg: PPOStageConfig,
    kl_coef: float,
    row_seeds: torch.Tensor | None = None,
    dense: torch.Tensor | None = None,
    gather=None,
    all_gather=None,
) -> Experience:
    """Macro actions → rewards → GAE over macro actions. ``scores``: (B,) final sequence rewards.

    Steps 3–5 are per row. ``gather`` (``Experience -> Experience``; the trainer passes
    ``gather_experience`` under data parallelism) is applied before the batch-level steps, advantage
    whitening and the logged statistics, so those are over the global batch, as in one process.
    ``row_seeds`` ((B,) long, `marlhf.macro.termination.derive_row_seeds`) and ``all_gather``
    (`marlhf.distributed.all_gather_padded`) go to the termination rule, so its segments do not depend
    on the split either (``randomized``: per-row draws; ``entropy``: tau over all ranks' rows)."""
    ppo, mcfg = cfg.ppo, cfg.macro
    mask = ro.action_mask
    # 3. macro actions
    term = rule(
        TerminationInputs(
            response_ids=ro.response_ids,
            action_mask=mask,
            ends_with_eos=ro.ends_with_eos,
            ref_logprobs=scored["ref_logprobs"],
            ref_entropy=scored.get("ref_entropy"),
            row_seeds=row_seeds,
            all_gather=all_gather,
        )
    )
    segments = build_segments(term.macro_end, mask)
    # 4. rewards: per-token KL penalty, the (clipped) score on the last response token
    kl = kl_penalty(scored["old_logprobs"], scored["ref_logprobs"], ppo.kl_estimator) * mask
    rewards = compose_rewards(
        kl,
        scores,
        mask,
        kl_coef=kl_coef,
        reward_clip=ppo.reward_clip if ppo.reward_clip > 0 else None,
        ends_with_eos=ro.ends_with_eos,
        no_eos_penalty=ppo.no_eos_penalty,
        dense=dense,
    )
    # 5. advantages over macro actions (MA-RLHF Sec. 3.2), broadcast to their tokens
    values = scored["values"] * mask
    adv, ret = macro_advantages(
        rewards,
        values,
        mask,
        segments,
        value_function=mcfg.value_function,
        reward_agg=mcfg.macro_reward_agg,
        gamma=ppo.gamma,
        lam=ppo.lam,
    )
    exp = Experience(
        ro,
        scored["old_logprobs"],
        scored["ref_logprobs"],
        values,
        scores,
        kl,
        rewards,
        adv,
        ret,
        segments.ids,
        scored["entropy"],
        term.fallback,
        {},
    )
    if gather is not None:
        exp = gather(exp)
        segments = build_segments(_macro_ends(exp.segment_ids), exp.rollout.action_mask)
    mask = exp.rollout.action_mask
    if ppo.whiten_advantages:
        exp.advantages = masked_whiten(exp.advantages, mask)
    exp.stats = macro_stats(segments, exp.fallback)
    exp.stats.update(
        {
            "objective/kl": float((exp.kl.sum(1)).mean()),
            "objective/reward": float((exp.rewards.sum(1)).mean()),
            "response/length": float(mask.sum(1).float().mean()),
            "response/eos_rate": float(exp.rollout.ends_with_eos.float().mean()),
            "policy/entropy": float(masked_mean(exp.entropy, mask)),
        }
    )
    exp.stats.update(term.stats)  # what the rule chose for the global batch (entropy: tau)
    return exp


def _macro_ends(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, A) bool macro_end from (B, A) segment ids (-1 on padding): a token whose successor is in
    another macro action (or is padding)."""
    following = torch.nn.functional.pad(segment_ids[:, 1:], (0, 1), value=-1)
    return (segment_ids >= 0) & (following != segment_ids)


def global_rows(n_rows: int, block: int, rank: int, world: int) -> torch.Tensor:
    """(n_rows,) long index in the global batch of each of ``rank``'s rows: they are generation
    batches of ``block`` rows, and rank ``r``'s batch ``j`` is global batch ``j·world + r``
    (`marlhf.batching.step_micro_batches`); ``gather_experience`` puts the rows in this order.

    >>> global_rows(4, 2, rank=1, world=2).tolist()
    [2, 3, 6, 7]
    """
    local = torch.arange(n_rows)
    return (local // block * world + rank) * block + local % block


def gather_experience(exp: Experience, pad_id: int, block: int) -> Experience:
    """Every data-parallel rank's rows on every rank, in the order of one process with the whole batch.

    Each rank holds ``B`` rows made of generation batches of ``block`` rows; rank ``r``'s batch ``j``
    is global batch ``j·world + r`` (``marlhf.batching.step_micro_batches``), so the gathered
    rank-major rows are reordered batch-major. Widths (T, A) are right-padded to the widest rank's.
    The PPO update then draws minibatches from the same global batch whatever the world size.
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
        Rollout(
            rows(ro.sequences, pad_id),
            rows(ro.attention_mask, False),
            rows(ro.response_start, 0),
            rows(ro.response_ids, pad_id),
            rows(ro.action_mask, False),
            rows(ro.ends_with_eos, False),
            [prompt_ids[i] for i in order.tolist()],
        ),
        rows(exp.old_logprobs, 0.0),
        rows(exp.ref_logprobs, 0.0),
        rows(exp.values, 0.0),
        rows(exp.scores, 0.0),
        rows(exp.kl, 0.0),
        rows(exp.rewards, 0.0),
        rows(exp.advantages, 0.0),
        rows(exp.returns, 0.0),
        rows(exp.segment_ids, -1),
        rows(exp.entropy, 0.0),
        rows(exp.fallback, False),
        dict(exp.stats),
    )


# --------------------------------------------------------------------------------------------------
# 6. update


def _slice_rollout(ro: Rollout, idx: torch.Tensor) -> Rollout:
    a = int(ro.action_mask[idx].sum(1).max().clamp(min=1))
    t = int(ro.attention_mask[idx].sum(1).max())
    return Rollout(
        ro.sequences[idx, :t],
        ro.attention_mask[idx, :t],
        ro.response_start[idx],
        ro.response_ids[idx, :a],
        ro.action_mask[idx, :a],
        ro.ends_with_eos[idx],
        [ro.prompt_ids[i] for i in idx.tolist()],
    )


def ppo_update(
    models: Models,
    exp: Experience,
    cfg: PPOStageConfig,
    train_actor: bool,
    generator: torch.Generator,
    unsup_batches=None,
) -> dict[str, float]:
    """``--ppo_epochs`` passes of minibatches over one experience batch; actor then critic per minibatch.
    ``unsup_batches`` (an iterator of SFT batches) adds ``--unsup_coef`` × LM loss to the actor's loss.

    ``exp`` is the global batch (``gather_experience``) and ``generator`` is in the same state on every
    rank, so all ranks draw one shuffle: minibatch ``i`` is rows ``order[i·M:(i+1)·M]`` with
    ``M = --per_device_training_batch_size × world``, of which rank ``r`` trains on the ``r``-th slice.
    Every mean (losses and stats) is divided by the count over the whole minibatch, and the losses are
    multiplied by the world size because DeepSpeed averages gradients over ranks: the update is the
    one process's with the global minibatch, whatever the split. Returns the stats' global means."""
    ppo = cfg.ppo
    ws, r = world_size(), rank()
    B = exp.rollout.sequences.shape[0]
    mb = ppo.per_device_training_batch_size
    M = mb * ws
    sums: dict[str, float] = {}
    n = 0
    for _ in range(ppo.ppo_epochs):
        order = torch.randperm(B, generator=generator)
        for s in range(0, B - M + 1, M):
            rows = order[s : s + M]  # the global minibatch
            idx = rows[r * mb : (r + 1) * mb]  # this rank's part of it
            # the minibatch's counts over all ranks (every rank holds every row)
            whole = exp.rollout.action_mask[rows]
            n_tokens = whole.sum().clamp(min=1)
            n_terms = policy_terms(whole, ppo.ratio_level, exp.segment_ids[rows]).sum().clamp(min=1)
            ro = _slice_rollout(exp.rollout, idx)
            a = ro.response_ids.shape[1]
            mask = ro.action_mask
            stats: dict[str, torch.Tensor | float] = {}
            if train_actor:
                need_ent = ppo.entropy_coef > 0
                logp, ent = policy_forward(
                    models.actor, ro, cfg.generation.temperature, with_entropy=need_ent
                )
                pg, pstats = policy_loss(
                    logp,
                    exp.old_logprobs[idx, :a],
                    exp.advantages[idx, :a],
                    mask,
                    cliprange=ppo.cliprange,
                    ratio_level=ppo.ratio_level,
                    segment_ids=exp.segment_ids[idx, :a],
                    num_terms=n_terms,
                    num_tokens=n_tokens,
                )
                loss = pg
                if need_ent:
                    ent_mean = entropy_bonus(ent, mask, num_tokens=n_tokens)
                    loss = loss - ppo.entropy_coef * ent_mean
                    stats["policy/entropy_train"] = ent_mean.detach()
                if unsup_batches is not None:
                    from marlhf.lm_loss import lm_loss_sum

                    sft = {k: v.to(models.actor.device) for k, v in next(unsup_batches).items()}
                    logits = models.actor(
                        input_ids=sft["input_ids"], attention_mask=sft["attention_mask"]
                    ).logits
                    nll, count = lm_loss_sum(logits, sft["labels"])
                    # over the SFT tokens of all ranks' batches, like the PPO terms
                    unsup = nll / all_reduce_sum(count).clamp(min=1)
                    loss = loss + ppo.unsup_coef * unsup
                    stats["loss/unsup"] = unsup.detach()
                models.actor.backward(loss * ws)
                models.actor.step()
                stats.update(pstats)
                stats["loss/policy"] = pg.detach()
            values = critic_forward(models.critic, ro)
            vl, vstats = value_loss(
                values,
                exp.values[idx, :a],
                exp.returns[idx, :a],
                mask,
                cliprange_value=ppo.cliprange_value,
                num_tokens=n_tokens,
            )
            models.critic.backward(vl * ws)
            models.critic.step()
            stats.update(vstats)
            stats["loss/value"] = vl.detach()
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


# --------------------------------------------------------------------------------------------------
# orchestration


def _gold_scorer(cfg: PPOStageConfig):
    """The synthetic task's true quality, logged when the prompts come from it (else None)."""
    from marlhf.data.long_tasks import gold_scorer_for

    return gold_scorer_for(cfg.data.data_path)


def _test_suite(meta: dict):
    """The test cases of a prompt's problem (APPS ``input_output``); an empty suite if none."""
    from marlhf.code_reward import TestSuite, parse_tests

    raw = meta.get("tests") or meta.get("input_output")
    return parse_tests(raw) if raw else TestSuite((), ())


def _has_tests(meta_json: str) -> bool:
    try:
        return len(_test_suite(json.loads(meta_json or "{}"))) > 0
    except ValueError:  # malformed tests: the problem cannot be scored
        return False


def _code_rewards(
    ro: Rollout, metas: list[dict], tokenizer, rewarder
) -> tuple[torch.Tensor, dict[str, float]]:
    """Execution reward (B,) of each response against its task's test cases (sandboxed), and the
    batch's ``code/*`` metrics (:func:`marlhf.code_reward.code_stats`)."""
    from marlhf.code_reward import code_stats

    texts = tokenizer.batch_decode(
        ro.response_ids.masked_fill(~ro.action_mask, tokenizer.pad_token_id),
        skip_special_tokens=True,
    )
    rewards, results = rewarder.evaluate(texts, [_test_suite(m) for m in metas])
    return torch.tensor(rewards, dtype=torch.float32), code_stats(results, rewards)


def sequence_scores(
    ro: Rollout,
    scored: dict[str, torch.Tensor],
    metas: list[dict],
    tokenizer,
    ppo: PPOConfig,
    rewarder=None,
    score_stats=None,
    oracle=None,
    prompt_texts: list[str] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """4. The sequence-level reward of each response, (B,): the reward model's end score
    (normalised with ``--normalize_reward``) plus, with a ``rewarder`` (``--reward_source code`` or
    ``rm+code``), the execution reward of the program against ``metas[b]``'s tests, plus, with an
    ``oracle`` (``--reward_source gold``: ``oracle(prompt, response_text) -> float``), the oracle's
    score of each response to ``prompt_texts[b]``. Returns the scores and the ``code/*`` metrics
    ({} without a rewarder). ``make_experience`` puts the (clipped) score on each row's last valid
    token."""
    scores = torch.zeros(ro.sequences.shape[0], device=ro.sequences.device)
    if oracle is not None:
        if prompt_texts is None or len(prompt_texts) != len(scores):
            raise ValueError("an oracle reward needs one prompt text per response")
        texts = tokenizer.batch_decode(
            ro.response_ids.masked_fill(~ro.action_mask, tokenizer.pad_token_id),
            skip_special_tokens=True,
        )
        scores = scores + torch.tensor(
            [float(oracle(p, r)) for p, r in zip(prompt_texts, texts, strict=True)],
            device=scores.device,
        )
    stats: dict[str, float] = {}
    raw_rm = scored.get("scores")
    if raw_rm is not None:
        rm = raw_rm
        if ppo.normalize_reward and score_stats is not None:
            rm = normalize_scores(rm, score_stats.mean, score_stats.std)
        scores = scores + rm
    if rewarder is not None:
        code, stats = _code_rewards(ro, metas, tokenizer, rewarder)
        scores = scores + code.to(scores.device)
    return scores, stats


def train(cfg: PPOStageConfig) -> Path:
    from marlhf.data.collate import PromptCollator
    from marlhf.data.tokenize import build_prompt_dataset

    mc, g, ppo = cfg.models, cfg.generation, cfg.ppo

    start(DeepSpeedConfig(local_rank=mc.local_rank, dist_timeout_s=mc.dist_timeout_s), ppo.seed)
    out = ensure_output_dir(cfg.log.output_dir)
    tokenizer = load_tokenizer(
        ModelConfig(
            model_name_or_path=mc.actor_model_name_or_path, trust_remote_code=mc.trust_remote_code
        ),
        padding_side="left",
    )
    prompts, dropped = build_prompt_dataset(
        cfg.data,
        tokenizer,
        "train",
        ppo.seed,
        g.max_prompt_seq_len,
        phase=3,
        overlong="drop" if g.overlong_prompts == "drop" else "truncate_left",
    )
    if ppo.reward_source in ("code", "rm+code"):
        # a problem without usable test cases earns no execution reward (APPS has a few): leave it out
        keep = [i for i, m in enumerate(prompts["meta"]) if _has_tests(m)]
        if len(keep) < len(prompts):
            log.warning(
                "%d of %d PPO prompts have no usable test cases for the code reward; left out",
                len(prompts) - len(keep),
                len(prompts),
            )
            prompts = prompts.select(keep)
    collate = PromptCollator(tokenizer.pad_token_id)
    gen_bs, gen_batches, ws = g.per_device_generation_batch_size, g.generation_batches, world_size()
    rollout_size = gen_bs * gen_batches
    if rollout_size % ppo.per_device_training_batch_size:
        raise ValueError(
            f"rollout per device ({gen_bs} x {gen_batches}) must be a multiple of "
            f"--per_device_training_batch_size {ppo.per_device_training_batch_size}"
        )
    spe = steps_per_epoch(len(prompts), gen_bs, gen_batches, ws)
    if spe == 0:
        raise ValueError(
            f"PPO split has {len(prompts)} prompts, fewer than one rollout ({rollout_size} x {ws})"
        )
    total = spe * ppo.num_train_epochs
    if ppo.max_steps:
        total = min(total, ppo.max_steps)
    minibatches = rollout_size // ppo.per_device_training_batch_size
    total_updates = max(1, total * ppo.ppo_epochs * minibatches // ppo.gradient_accumulation_steps)

    if (
        g.generation_backend == "static"
        and mc.actor_zero_stage == 3
        and not g.enable_zero3_generation_gather
    ):
        raise ValueError(
            "--generation_backend static under ZeRO-3 needs --enable_zero3_generation_gather "
            "(the static decoder has no synced_gpus mode)"
        )
    models = build_models(cfg, total_updates)
    rule = build_termination(cfg.macro, tokenizer)
    # Segment-PPO's dense rewards cut responses with the segment RM's own rule: built once here
    seg_rule, seg_norm = _segment_rule(models, tokenizer) if ppo.dense_reward else (None, None)
    need_entropy = "ref_entropy" in rule.needs or (
        seg_rule is not None and "ref_entropy" in seg_rule.needs
    )
    eos_ids = eos_token_ids(tokenizer, cfg.data)
    kl_ctl = (
        AdaptiveKLController(ppo.kl_ctl, ppo.target_kl, ppo.kl_horizon)
        if ppo.target_kl
        else FixedKLController(ppo.kl_ctl)
    )
    gold = _gold_scorer(cfg)
    if ppo.reward_source == "gold" and gold is None:
        raise ValueError(
            "--reward_source gold needs the synthetic task's prompts (--data_path synthetic-tldr): "
            "the gold score is only defined there"
        )
    rewarder = None
    if ppo.reward_source in ("code", "rm+code"):
        from marlhf.code_reward import CodeRewarder

        rewarder = CodeRewarder.from_config(cfg.code)
    score_stats = models.reward_info.get("score_stats") if models.reward_info else None

    run_config = config_to_dict(cfg)
    if is_main():
        write_json(out / "run_config.json", run_config)
        write_json(out / "ds_config.json", {"actor": models.actor_ds, "critic": models.critic_ds})
        log.info(
            "MA-PPO: %d prompts (%d over-long %s), %d steps, rollout %d/device, termination=%s",
            len(prompts),
            dropped,
            "dropped" if g.overlong_prompts == "drop" else "truncated",
            total,
            rollout_size,
            cfg.macro.termination_condition,
        )

    state_root = out / "train_state"
    global_step = 0
    # the minibatch shuffle: one stream shared by all ranks (minibatches are drawn from the global batch)
    shuffle = torch.Generator().manual_seed(ppo.seed)
    found = find_resume(state_root, cfg.log.resume)
    if found is not None:
        client = load_train_state({"actor": models.actor, "critic": models.critic}, *found)
        global_step = client["global_step"]
        kl_ctl.load_state_dict(client["kl_ctl"])
        if "shuffle" in client:
            shuffle.set_state(client["shuffle"])
        set_rng_state(client["rng"])
        log.info("resumed from %s/%s at step %d", found[0], found[1], global_step)

    unsup_iter = None
    if ppo.unsup_coef > 0:
        # batches already consumed before a resume are skipped, so a resumed run sees the same data
        consumed = (
            max(0, global_step - ppo.critic_warmup_steps)
            * ppo.ppo_epochs
            * (rollout_size // ppo.per_device_training_batch_size)
        )
        unsup_iter = _sft_batches(cfg, tokenizer, skip=consumed)
    ema = None
    if ppo.enable_ema:
        from marlhf.ema import EMA

        ema = EMA(models.actor.module, ppo.ema_decay, zero3=mc.actor_zero_stage == 3)
        if found is not None and (state_root / "ema.pt").exists():
            ema.shadow = torch.load(state_root / "ema.pt", map_location="cpu")

    tracker = Tracker(cfg.log, start_step=global_step)  # drops rows logged after the checkpoint
    bar = progress(total, global_step, "ma-ppo", cfg.log.disable_progress_bar)

    def save(step: int, final: bool) -> None:
        from marlhf.reward_model import save_reward_model_state

        actor_dir = out / "actor" if final else out / "checkpoints" / f"step-{step}" / "actor"
        critic_dir = out / "critic" if final else out / "checkpoints" / f"step-{step}" / "critic"
        save_hf_causal_lm(
            models.actor.module,
            tokenizer,
            actor_dir,
            zero_stage=mc.actor_zero_stage,
            run_config=run_config,
            ds_config=models.actor_ds,
        )
        state = gather_state_dict(models.critic.module, mc.critic_zero_stage)
        if is_main():
            from marlhf.models import merge_lora_state_dict

            if mc.critic_lora_dim:
                lcfg = models.critic.module.backbone.peft_config["default"]
                state = merge_lora_state_dict(state, lcfg.lora_alpha / lcfg.r)
            save_reward_model_state(
                state,
                models.critic.module.config,
                tokenizer,
                critic_dir,
                rm_type="end",
                extra={"role": "critic"},
            )
            write_json(critic_dir / "run_config.json", run_config)
        if ema is not None:
            from marlhf.models import merge_lora_state_dict, unwrap_peft

            like = gather_state_dict(models.actor.module, mc.actor_zero_stage)
            if is_main():
                base, scaling = unwrap_peft(models.actor.module)
                averaged = ema.state_dict(like)
                if scaling is not None:
                    averaged = merge_lora_state_dict(averaged, scaling)
                ema_dir = actor_dir.parent / "actor_ema"
                base.save_pretrained(ema_dir, state_dict=averaged)
                tokenizer.save_pretrained(ema_dir)
                state_root.mkdir(parents=True, exist_ok=True)
                torch.save(ema.shadow, state_root / "ema.pt")
        client = {
            "global_step": step,
            "kl_ctl": kl_ctl.state_dict(),
            "shuffle": shuffle.get_state(),
            "rng": rng_state(),
        }
        save_train_state(
            {"actor": models.actor, "critic": models.critic},
            state_root,
            step,
            client,
            cfg.log.keep_checkpoints,
        )

    while global_step < total:
        epoch, step_in_epoch = divmod(global_step, spe)
        perm = epoch_permutation(len(prompts), ppo.seed, epoch)
        times: dict[str, float] = {}
        # 1.-2. rollouts and scoring, `generation_batches` calls
        t = time.perf_counter()
        rollouts, scoreds, metas = [], [], []
        # the static decoder samples each row from (seed, step, its global row; stream 2, apart from
        # the termination's 0 and the dense rewards' 1): the rollouts do not depend on the split over
        # ranks, and a resumed run redraws them without a saved generator state
        gen_rows = global_rows(rollout_size, gen_bs, rank(), ws)
        micro = step_micro_batches(perm, step_in_epoch, gen_bs, gen_batches, ws, rank())
        for j, idx in enumerate(micro):
            batch = collate([prompts[i] for i in idx])
            sample_seeds = None
            if g.generation_backend == "static":
                rows_j = gen_rows[j * gen_bs : j * gen_bs + len(idx)]
                sample_seeds = derive_row_seeds(ppo.seed, global_step, rows_j, stream=2)
            t0 = time.perf_counter()
            ro = generate(models, batch, cfg, tokenizer, eos_ids, row_seeds=sample_seeds)
            times["time/generate"] = times.get("time/generate", 0.0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            scoreds.append(score(models, ro, cfg, need_entropy))
            times["time/score"] = times.get("time/score", 0.0) + time.perf_counter() - t0
            rollouts.append(ro)
            metas.extend(
                json.loads(m) if isinstance(m, str) else (m or {})
                for m in batch.get("meta", [{}] * len(idx))
            )
        prompt_texts = [t for idx in micro for t in (prompts[i]["prompt"] for i in idx)]
        ro, scored = _concat(rollouts, scoreds, tokenizer.pad_token_id)
        # 4. sequence-level reward: RM score (normalised if asked) and/or execution reward
        t0 = time.perf_counter()
        scores, code_metrics = sequence_scores(
            ro,
            scored,
            metas,
            tokenizer,
            ppo,
            rewarder,
            score_stats,
            oracle=gold if ppo.reward_source == "gold" else None,
            prompt_texts=prompt_texts,
        )
        if rewarder is not None:
            times["time/code_reward"] = time.perf_counter() - t0
        raw_rm = scored.get("scores")
        # `randomized` draws each row from (seed, step, its global row): split-independent, and a
        # resumed run redraws the same segments without a saved generator state
        rows = global_rows(len(ro.prompt_ids), gen_bs, rank(), ws)
        dense = None
        if ppo.dense_reward:
            dense_seeds = derive_row_seeds(ppo.seed, global_step, rows, stream=1)
            dense = _dense_rewards(seg_rule, seg_norm, ro, scored, cfg, dense_seeds)
        t0 = time.perf_counter()
        exp = make_experience(
            ro,
            scored,
            scores,
            rule,
            cfg,
            kl_ctl.value,
            derive_row_seeds(ppo.seed, global_step, rows),
            dense,
            gather=lambda e: gather_experience(e, tokenizer.pad_token_id, gen_bs),
            all_gather=all_gather_padded,
        )
        times["time/macro"] = time.perf_counter() - t0
        # 6. update
        t0 = time.perf_counter()
        train_actor = global_step >= ppo.critic_warmup_steps
        actor_lr = models.actor.get_lr()[0]  # the rate this update is taken with
        upd = ppo_update(
            models, exp, cfg, train_actor, shuffle, unsup_iter if train_actor else None
        )
        if ema is not None and train_actor:
            ema.update(models.actor.module)
        times["time/train"] = time.perf_counter() - t0
        times["time/step"] = time.perf_counter() - t
        global_step += 1
        kl_now = float(all_reduce_mean(torch.tensor(exp.stats["objective/kl"])))
        kl_ctl.update(kl_now, rollout_size * ws)
        metrics = {**exp.stats, **upd, **times, **code_metrics}
        metrics["objective/score"] = (
            float(raw_rm.mean()) if raw_rm is not None else float(scores.mean())
        )
        metrics["objective/kl_coef"] = kl_ctl.value
        # exp.stats, upd and the two below are over the global batch already (the same on every rank);
        # the row means of this rank's rows (score, gold) average over ranks, which hold equal counts
        metrics["value/explained_variance"] = explained_variance(
            exp.values, exp.returns, exp.rollout.action_mask
        )
        metrics["value/mean"] = float(masked_mean(exp.values, exp.rollout.action_mask))
        if gold is not None:
            texts = tokenizer.batch_decode(ro.response_ids, skip_special_tokens=True)
            metrics["objective/gold"] = sum(
                gold(p, r) for p, r in zip(prompt_texts, texts, strict=True)
            ) / len(texts)
        metrics = {
            k: float(all_reduce_mean(torch.tensor(float(v)))) for k, v in sorted(metrics.items())
        }
        metrics["lr/actor"] = actor_lr
        tracker.log(metrics, global_step)
        bar.update(1)
        bar.set_postfix(
            score=f"{metrics['objective/score']:.3f}",
            kl=f"{metrics['objective/kl']:.3f}",
            macro=f"{metrics['macro/mean_len']:.1f}",
        )
        if g.print_answers and is_main() and global_step % g.print_answers_interval == 0:
            _print_answer(tokenizer, ro, exp, prompt_texts)
        if cfg.log.save_steps and global_step % cfg.log.save_steps == 0 and global_step < total:
            save(global_step, final=False)
    bar.close()
    save(global_step, final=True)
    tracker.close()
    if rewarder is not None:
        rewarder.close()
    if is_main():
        log.info("MA-PPO actor saved to %s", out / "actor")
    return out


def _sft_batches(cfg: PPOStageConfig, tokenizer, skip: int):
    """Endless SFT micro-batches for the pretraining-mix loss (``--unsup_coef``), this rank's shard."""
    from marlhf.data.collate import SFTCollator
    from marlhf.data.tokenize import build_sft_dataset

    data = replace(cfg.data, data_path=cfg.ppo.unsup_data_path or cfg.data.data_path)
    ds = build_sft_dataset(data, tokenizer, "train", cfg.ppo.seed)
    collate = SFTCollator(tokenizer.pad_token_id)
    mb, ws = cfg.ppo.per_device_training_batch_size, world_size()
    spe = steps_per_epoch(len(ds), mb, 1, ws)
    if spe == 0:
        raise ValueError(f"--unsup_coef: the SFT data has {len(ds)} examples, fewer than one batch")
    i = skip
    while True:
        epoch, step = divmod(i, spe)
        perm = epoch_permutation(len(ds), cfg.ppo.seed + 1, epoch)
        (idx,) = step_micro_batches(perm, step, mb, 1, ws, rank())
        yield collate([ds[j] for j in idx])
        i += 1


def _concat(rollouts: list[Rollout], scoreds: list[dict], pad_id: int) -> tuple[Rollout, dict]:
    """Concatenate rollouts of different lengths (right-padding sequences and responses)."""
    if len(rollouts) == 1:
        return rollouts[0], scoreds[0]
    T = max(r.sequences.shape[1] for r in rollouts)
    A = max(r.response_ids.shape[1] for r in rollouts)

    def padr(x: torch.Tensor, n: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, n - x.shape[1]), value=value)

    ro = Rollout(
        torch.cat([padr(r.sequences, T, pad_id) for r in rollouts]),
        torch.cat([padr(r.attention_mask, T, False) for r in rollouts]),
        torch.cat([r.response_start for r in rollouts]),
        torch.cat([padr(r.response_ids, A, pad_id) for r in rollouts]),
        torch.cat([padr(r.action_mask, A, False) for r in rollouts]),
        torch.cat([r.ends_with_eos for r in rollouts]),
        sum((r.prompt_ids for r in rollouts), []),
    )
    scored: dict[str, torch.Tensor | None] = {}
    for k in scoreds[0]:
        vals = [s[k] for s in scoreds]
        if vals[0] is None:
            scored[k] = None
        elif vals[0].dim() == 1:
            scored[k] = torch.cat(vals)
        else:
            width = T if k == "rm_values" else A
            scored[k] = torch.cat([padr(v, width, 0.0) for v in vals])
    return ro, scored


def _segment_rule(models: Models, tokenizer):
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


def _dense_rewards(
    seg_rule,
    normalizer,
    ro: Rollout,
    scored: dict,
    cfg: PPOStageConfig,
    seeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Segment-PPO dense rewards: the segment RM's value at each of its segments' last tokens,
    location-normalised (``normalizer``), spread over the segment's tokens. ``seg_rule`` and
    ``normalizer``: from :func:`_segment_rule`."""
    from marlhf.reward_norm import segment_positions, segment_readout

    if "rm_values" not in scored:
        raise ValueError("--dense_reward needs the segment reward model's per-token values")
    term = seg_rule(
        TerminationInputs(
            ro.response_ids,
            ro.action_mask,
            ro.ends_with_eos,
            scored["ref_logprobs"],
            scored.get("ref_entropy"),
            row_seeds=seeds,
            all_gather=all_gather_padded,
        )
    )
    seg_rewards, seg_mask = segment_readout(scored["rm_values"], ro.response_start, term.macro_end)
    if normalizer is not None:
        seg_rewards = normalizer.apply(seg_rewards, segment_positions(seg_mask)) * seg_mask
    seg_ids = build_segments(term.macro_end, ro.action_mask).ids
    return spread_segment_rewards(seg_rewards, seg_ids, cfg.ppo.dense_reward_mode)


def _print_answer(tokenizer, ro: Rollout, exp: Experience, prompts: list[str]) -> None:
    from marlhf.macro.render import render_terminal, token_pieces

    n = int(ro.action_mask[0].sum())
    ids = ro.response_ids[0, :n].tolist()
    ends = (exp.segment_ids[0, :n] != torch.roll(exp.segment_ids[0, :n], -1)).tolist()
    ends[-1] = True
    print(
        f"\n--- prompt ---\n{prompts[0]}\n--- response (| = macro-action boundary), score {float(exp.scores[0]):.3f} ---"
    )
    print(render_terminal(token_pieces(tokenizer, ids), ends))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(PPOStageConfig, argv)
    train(cfg)


if __name__ == "__main__":
    main()
