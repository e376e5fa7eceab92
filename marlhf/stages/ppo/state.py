"""What stage 3 carries from step to step and across a restart: the step, the KL controller, the
minibatch shuffle, the RNGs and the actor's EMA; its checkpoints, resume and metric tracker.

Layout of ``--output_dir`` (what later stages and a resumed run read)::

    actor/  critic/  [actor_ema/]                the final models (HF causal LM; reward model;
                                                 no critic with a critic-free estimator)
    checkpoints/step-N/{actor,critic,actor_ema}  every --save_steps steps (each checkpoint, and
                                                 each final model, written as .partial-<name>/
                                                 and renamed when complete)
    train_state/                                 DeepSpeed engine states (actor, critic), the step,
                                                 KL controller, shuffle and RNG states;
                                                 actor/step-N/ema.pt, the EMA of each kept
                                                 checkpoint (checksummed with it)
    run_config.json  ds_config.json  metrics.jsonl  tensorboard/
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from marlhf.algo.kl_rewards import AdaptiveKLController, FixedKLController
from marlhf.models.ema import EMA
from marlhf.models.lora import merge_lora_state_dict, unwrap_peft
from marlhf.models.save import save_hf_causal_lm, save_reward_checkpoint
from marlhf.runtime.checkpoint import (
    find_resume,
    gather_state_dict,
    load_train_state,
    rng_state,
    save_train_state,
    set_rng_state,
    write_json,
)
from marlhf.runtime.checkpoint_files import naming_write_errors, staged_directory
from marlhf.runtime.distributed import is_main
from marlhf.runtime.run_settings import SETTINGS_FILE, saved_flags, settings_writer
from marlhf.runtime.tracking import Tracker
from marlhf.stages.common import progress

if TYPE_CHECKING:
    from marlhf.config import LoggingConfig
    from marlhf.stages.ppo.config import ActorCriticConfig, PPOConfig
    from marlhf.stages.ppo.models import Models

log = logging.getLogger("marlhf.ppo")


@dataclass
class TrainState:
    """Everything a step changes besides the engines' weights and optimizers."""

    step: int  # PPO steps done
    kl_ctl: FixedKLController | AdaptiveKLController
    shuffle: torch.Generator  # the minibatch shuffle, one stream shared by all ranks
    ema: EMA | None  # the actor's EMA (--enable_ema)


def kl_controller(ppo: PPOConfig) -> FixedKLController | AdaptiveKLController:
    """The KL coefficient β: adaptive towards ``--target_kl`` if given, else fixed ``--kl_ctl``."""
    if ppo.target_kl:
        return AdaptiveKLController(ppo.kl_ctl, ppo.target_kl, ppo.kl_horizon)
    return FixedKLController(ppo.kl_ctl)


def _engines(models: Models) -> dict:
    """The trained engines whose states a checkpoint holds (no critic for a critic-free estimator)."""
    engines = {"actor": models.actor, "critic": models.critic}
    return {k: v for k, v in engines.items() if v is not None}


def resume(
    models: Models,
    ppo: PPOConfig,
    log_cfg: LoggingConfig,
    models_cfg: ActorCriticConfig,
    out: Path,
) -> TrainState:
    """A fresh state, or the one of the checkpoint ``--resume`` picks under ``out/train_state``
    (engines, step, KL controller, shuffle, RNGs and EMA restored)."""
    state_root = out / "train_state"
    # the minibatch shuffle: one stream shared by all ranks (minibatches are drawn from the global batch)
    state = TrainState(
        step=0,
        kl_ctl=kl_controller(ppo),
        shuffle=torch.Generator().manual_seed(ppo.optim.seed),
        ema=None,
    )
    found = find_resume(state_root, log_cfg.resume)
    if found is not None:
        _check_engines(found[0], found[1], _engines(models), ppo.advantage_estimator)
        client = load_train_state(_engines(models), *found)
        state.step = client["global_step"]
        state.kl_ctl.load_state_dict(client["kl_ctl"])
        if "shuffle" in client:
            state.shuffle.set_state(client["shuffle"])
        set_rng_state(client["rng"])
        log.info("resumed from %s/step-%d", found[0], state.step)
    if ppo.enable_ema:
        state.ema = EMA(
            models.actor.module, ppo.ema_decay, zero3=models_cfg.actor.ds.zero_stage == 3
        )
        # the tag actually loaded (load_train_state falls back past a checkpoint it cannot read)
        tag = f"step-{state.step}"
        shadow = _load_ema(found[0], tag) if found is not None else None
        if shadow is not None:
            state.ema.shadow = shadow
    return state


def _check_engines(root: Path, tag: str, engines: dict, advantage_estimator: str) -> None:
    """Refuse a checkpoint that lacks an engine this run trains: a critic-free run (grpo, rloo,
    ...) resumed with ``--advantage_estimator gae`` has no critic state to resume."""
    missing = [name for name in engines if not (root / name / tag).is_dir()]
    if "critic" in missing:
        saved = saved_flags(root, tag).get("advantage_estimator")
        trained = f"--advantage_estimator {saved}" if saved else "a critic-free estimator"
        raise ValueError(
            f"{root / tag}: the run has no critic to resume (it was trained with {trained}), "
            f"and --advantage_estimator {advantage_estimator} trains one. Resume with "
            "the run's estimator, or start over with --resume never or another --output_dir"
        )
    if missing:
        raise ValueError(f"{root / tag}: the checkpoint holds no state of {', '.join(missing)}")


EMA_FILE = "ema.pt"  # the EMA shadow, inside the actor's tag: train_state/actor/step-N/ema.pt


def _load_ema(state_root: Path, tag: str) -> dict[str, torch.Tensor] | None:
    """The EMA shadow saved with checkpoint ``tag`` (in the actor's tag, checksummed with it; older
    versions kept ``ema-<tag>.pt`` or one ``ema.pt`` beside the tags); None if the run saved none."""
    for path in (
        state_root / "actor" / tag / EMA_FILE,
        state_root / f"ema-{tag}.pt",
        state_root / "ema.pt",
    ):
        if path.exists():
            if path.parent == state_root:
                log.warning(
                    "%s: the EMA of %s is read from %s (an older layout)", state_root, tag, path
                )
            return torch.load(path, map_location="cpu")
    log.warning("%s/%s holds no EMA: it starts from the resumed weights", state_root, tag)
    return None


def open_tracker(
    log_cfg: LoggingConfig,
    state: TrainState,
    total: int,
    run_name: str | None = None,
    run_config: dict | None = None,
):
    """The metrics tracker (dropping rows an interrupted run logged after the checkpoint), named
    ``run_name`` (what runs: ``run_label``), and the progress bar."""
    tracker = Tracker(log_cfg, start_step=state.step, run_name=run_name, config=run_config)
    bar = progress(
        total, state.step, run_name or "ppo", log_cfg.disable_progress_bar, log_cfg.log_interval
    )
    return tracker, bar


# --------------------------------------------------------------------------------------------------
# checkpoints


def _save_critic(models: Models, tokenizer, critic_dir: Path, zero_stage: int, run_config):
    """The critic as a reward-model directory (LoRA merged, its adapter beside: as a reward
    model's; ``zero_stage``: the critic's), with the run's and its DeepSpeed configs."""
    save_reward_checkpoint(
        models.critic.module,
        tokenizer,
        critic_dir,
        zero_stage=zero_stage,
        rm_type="end",
        run_config=run_config,
        ds_config=models.critic_ds,
        extra={"role": "critic"},
    )


def _save_ema(
    models: Models, ema: EMA, tokenizer, ema_dir: Path, zero_stage: int, run_config
) -> None:
    """The actor's EMA as an HF model directory (LoRA merged) with the run's configs (its shadow for
    a resume goes into the train state: :func:`save_checkpoint`; ``zero_stage``: the actor's)."""
    like = gather_state_dict(models.actor.module, zero_stage)
    if not is_main():
        return
    base, scaling = unwrap_peft(models.actor.module)
    averaged = ema.state_dict(like)
    if scaling is not None:
        averaged = merge_lora_state_dict(averaged, scaling)
    with naming_write_errors(ema_dir, "EMA model"):
        base.save_pretrained(ema_dir, state_dict=averaged)
        tokenizer.save_pretrained(ema_dir)
    write_json(ema_dir / "run_config.json", run_config)
    write_json(ema_dir / "ds_config.json", models.actor_ds)


def save_checkpoint(
    models: Models,
    state: TrainState,
    tokenizer,
    log_cfg: LoggingConfig,
    models_cfg: ActorCriticConfig,
    run_config: dict,
    final: bool,
    settings: dict | None = None,
    models_too: bool = True,
) -> None:
    """The models after ``state.step`` steps (``output_dir/{actor,critic}`` when ``final``, else
    ``checkpoints/step-N/``; none without ``models_too``) and a resumable train state (the newest
    ``--keep_checkpoints`` kept) with the run's ``settings``
    (:mod:`marlhf.runtime.run_settings`). Every rank calls it."""
    out = Path(log_cfg.output_dir)
    step = state.step
    if models_too:
        _save_models(models, state, tokenizer, out, models_cfg, run_config, final)
    state_root = out / "train_state"
    extra: dict = {"actor": {}}
    if state.ema is not None:
        shadow = state.ema.shadow
        extra["actor"][EMA_FILE] = lambda path: torch.save(shadow, path)
    if settings:
        extra["actor"][SETTINGS_FILE] = settings_writer(settings)
    client = {
        "global_step": step,
        "kl_ctl": state.kl_ctl.state_dict(),
        "shuffle": state.shuffle.get_state(),
        "rng": rng_state(),
    }
    save_train_state(
        _engines(models), state_root, step, client, log_cfg.keep_checkpoints, extra_files=extra
    )


def _save_models(
    models: Models,
    state: TrainState,
    tokenizer,
    out: Path,
    models_cfg: ActorCriticConfig,
    run_config: dict,
    final,
) -> None:
    """The actor (and critic, EMA) after ``state.step`` steps: ``out/{actor,critic}`` when
    ``final``, else ``out/checkpoints/step-N/``."""
    step = state.step
    # written aside, then renamed, so a kill mid-save leaves nothing half-written: checkpoints/step-N
    # as a whole, and each final model directory (actor/, critic/, actor_ema/) on its own
    staged = nullcontext(out) if final else staged_directory(out / "checkpoints" / f"step-{step}")
    each = staged_directory if final else nullcontext
    with staged as root:
        with each(root / "actor") as where:
            save_hf_causal_lm(
                models.actor.module,
                tokenizer,
                where,
                zero_stage=models_cfg.actor.ds.zero_stage,
                run_config=run_config,
                ds_config=models.actor_ds,
            )
        if models.critic is not None:
            with each(root / "critic") as where:
                _save_critic(models, tokenizer, where, models_cfg.critic.ds.zero_stage, run_config)
        if state.ema is not None:
            with each(root / "actor_ema") as where:
                _save_ema(
                    models, state.ema, tokenizer, where, models_cfg.actor.ds.zero_stage, run_config
                )
