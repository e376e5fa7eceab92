"""Stage 1: supervised fine-tuning on the SFT split (20 % of each dataset with ``--data_split 2,4,4``).

Loss on response tokens only (prompt and padding masked; ``--sft_include_prompt_loss`` adds the prompt),
normalised by the number of supervised tokens in the whole optimizer step across micro-batches and
ranks, so the update does not depend on how the global batch is split. Runs under the ``deepspeed``
launcher, ``torchrun`` or plain ``python``::

    python -m marlhf.stages.sft --model_name_or_path tiny --output_dir out/sft
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from marlhf.batching import (
    epoch_permutation,
    padded_eval_shard,
    step_micro_batches,
    steps_per_epoch,
)
from marlhf.checkpoint import (
    find_resume,
    load_train_state,
    rng_state,
    save_hf_causal_lm,
    save_train_state,
    set_rng_state,
    write_json,
)
from marlhf.cli import config_to_dict, parse_config
from marlhf.config import DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.data.config import DataConfig
from marlhf.distributed import all_reduce_sum, is_main, rank, world_size
from marlhf.engine import build_train_engine
from marlhf.lm_loss import lm_loss_sum
from marlhf.models import apply_lora, load_causal_lm, load_tokenizer
from marlhf.stages.common import ensure_output_dir, progress, start
from marlhf.tracking import Tracker

log = logging.getLogger("marlhf.sft")


@dataclass
class SFTConfig:
    """Stage 1: supervised fine-tuning (SFT)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ds: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)


def _to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def evaluate(engine, dataset, collate, cfg: SFTConfig) -> dict[str, float]:
    """Token-level perplexity of the eval split (summed over ranks).

    Every rank runs as many forward passes (ZeRO-3 gathers parameters collectively in each): a rank
    whose shard is short runs padding batches and discards them (``padded_eval_shard``).
    """
    engine.eval()
    nll = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    for idx, real in padded_eval_shard(
        len(dataset), cfg.optim.per_device_eval_batch_size, world_size(), rank(), cfg.log.eval_iters
    ):
        batch = _to_device(collate([dataset[i] for i in idx]), engine.device)
        out = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        if not real:
            continue
        s, c = lm_loss_sum(out.logits, batch["labels"])
        nll += s.double().cpu()
        count += c.double().cpu()
    engine.train()
    nll, count = all_reduce_sum(nll), all_reduce_sum(count)
    loss = float(nll / count.clamp(min=1))
    return {"eval/loss": loss, "eval/ppl": math.exp(min(loss, 50.0))}


def train(cfg: SFTConfig) -> Path:
    from marlhf.data.collate import SFTCollator
    from marlhf.data.tokenize import build_sft_dataset

    start(cfg.ds, cfg.optim.seed)
    out = ensure_output_dir(cfg.log.output_dir)
    tokenizer = load_tokenizer(cfg.model, padding_side="right")
    train_ds = build_sft_dataset(cfg.data, tokenizer, "train", cfg.optim.seed)
    eval_ds = build_sft_dataset(cfg.data, tokenizer, "eval", cfg.optim.seed)
    collate = SFTCollator(tokenizer.pad_token_id)

    micro, acc, ws = (
        cfg.optim.per_device_train_batch_size,
        cfg.optim.gradient_accumulation_steps,
        world_size(),
    )
    spe = steps_per_epoch(len(train_ds), micro, acc, ws)
    if spe == 0:
        raise ValueError(
            f"SFT split has {len(train_ds)} examples, fewer than one global batch "
            f"({micro} x {acc} x {ws}); lower the batch size or add data"
        )
    total = spe * cfg.optim.num_train_epochs
    if cfg.optim.max_steps:
        total = min(total, cfg.optim.max_steps)

    zero3 = None
    if (
        cfg.ds.zero_stage == 3
    ):  # load the weights partitioned across ranks (big models never fit whole)
        from marlhf.engine import ds_config

        zero3 = ds_config(
            zero_stage=3, dtype=cfg.model.dtype, micro_batch_size=micro, inference=True
        )
    model = apply_lora(load_causal_lm(cfg.model, ds_zero3_config=zero3), cfg.model)
    engine, ds_json = build_train_engine(
        model,
        model_cfg=cfg.model,
        ds=cfg.ds,
        optim=cfg.optim,
        total_steps=total,
        micro_batch_size=micro,
    )
    run_config = config_to_dict(cfg)
    if is_main():
        write_json(out / "run_config.json", run_config)
        write_json(out / "ds_config.json", ds_json)
        log.info(
            "SFT: %d train / %d eval examples, %d steps/epoch, %d steps",
            len(train_ds),
            len(eval_ds),
            spe,
            total,
        )

    state_root = out / "train_state"
    global_step = 0
    found = find_resume(state_root, cfg.log.resume)
    if found is not None:
        client = load_train_state({"model": engine}, *found)
        global_step = client["global_step"]
        set_rng_state(client["rng"])
        log.info("resumed from %s/%s at step %d", found[0], found[1], global_step)

    tracker = Tracker(cfg.log, start_step=global_step)  # drops rows logged after the checkpoint
    bar = progress(total, global_step, "sft", cfg.log.disable_progress_bar)
    engine.train()

    def checkpoint(step: int, hf_dir: Path) -> None:
        save_hf_causal_lm(
            engine.module,
            tokenizer,
            hf_dir,
            zero_stage=cfg.ds.zero_stage,
            run_config=run_config,
            ds_config=ds_json,
        )
        client = {"global_step": step, "rng": rng_state()}
        save_train_state({"model": engine}, state_root, step, client, cfg.log.keep_checkpoints)

    while global_step < total:
        epoch, step_in_epoch = divmod(global_step, spe)
        perm = epoch_permutation(len(train_ds), cfg.optim.seed, epoch)
        t0 = time.perf_counter()
        micro_batches = [
            collate([train_ds[i] for i in idx])
            for idx in step_micro_batches(perm, step_in_epoch, micro, acc, ws, rank())
        ]
        # 1. the number of supervised tokens in the whole optimizer step, over all ranks
        local = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
        n_tokens = all_reduce_sum(torch.tensor(float(local))).clamp(min=1.0)
        # 2. forward/backward each micro-batch; DeepSpeed averages gradients over ranks, hence × world
        # the rate this step uses (the scheduler moves on inside engine.step)
        lr = engine.get_lr()[0]
        loss_sum = torch.zeros(())
        for batch in micro_batches:
            batch = _to_device(batch, engine.device)
            outputs = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            nll, _ = lm_loss_sum(outputs.logits, batch["labels"])
            engine.backward(nll * ws / n_tokens.to(nll.device), scale_wrt_gas=False)
            engine.step()
            loss_sum += nll.detach().float().cpu()
        global_step += 1
        loss = float(all_reduce_sum(loss_sum) / n_tokens)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", epoch=epoch)
        if global_step % cfg.log.log_interval == 0 or global_step == total:
            tracker.log(
                {
                    "train/loss": loss,
                    "train/tokens": float(n_tokens),
                    "train/step_time_s": time.perf_counter() - t0,
                    "lr": lr,
                    "train/epoch": epoch + (step_in_epoch + 1) / spe,
                },
                global_step,
            )
        end_of_epoch = global_step % spe == 0
        if (
            (cfg.log.eval_interval and global_step % cfg.log.eval_interval == 0)
            or (not cfg.log.eval_interval and end_of_epoch)
            or global_step == total
        ):
            metrics = evaluate(engine, eval_ds, collate, cfg)
            tracker.log(metrics, global_step)
            if is_main():
                log.info("step %d: %s", global_step, {k: round(v, 4) for k, v in metrics.items()})
        if cfg.log.save_steps and global_step % cfg.log.save_steps == 0 and global_step < total:
            checkpoint(global_step, out / "checkpoints" / f"step-{global_step}")
    bar.close()
    checkpoint(global_step, out)  # the final model is the run directory itself
    tracker.close()
    if is_main():
        log.info("SFT model saved to %s", out)
    return out


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(SFTConfig, argv)
    train(cfg)


if __name__ == "__main__":
    main()
