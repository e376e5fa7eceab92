"""Stage 1: supervised fine-tuning on the SFT split (20 % of each dataset with ``--data_split 2,4,4``).

Loss on response tokens only (prompt and padding masked; ``--sft_include_prompt_loss`` adds the prompt),
normalised by the number of supervised tokens in the whole optimizer step across micro-batches and
ranks, so the update does not depend on how the global batch is split. Runs under the ``deepspeed``
launcher, ``torchrun`` or plain ``python``::

    python -m marlhf.stages.sft --model_name_or_path tiny --output_dir out/sft
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path

import torch

from marlhf.cli import parse_config
from marlhf.data.collate import SFTCollator
from marlhf.data.tokenize import build_sft_dataset
from marlhf.models.lm_loss import causal_lm_loss_sum
from marlhf.models.load import load_causal_lm
from marlhf.models.lora import apply_lora
from marlhf.models.packing import packing_mode
from marlhf.models.save import save_hf_causal_lm
from marlhf.runtime.batching import padded_eval_shard
from marlhf.runtime.distributed import all_reduce_sum, is_main, rank, world_size
from marlhf.runtime.engine import ds_config
from marlhf.runtime.finite import guarded_step
from marlhf.runtime.micro_batches import accumulate, regroup
from marlhf.stages.common import run_stage, setup_supervised, to_device
from marlhf.stages.exits import run_program
from marlhf.stages.sft.config import SFTConfig

log = logging.getLogger("marlhf.sft")


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
        batch = to_device(collate([dataset[i] for i in idx]), engine.device)
        s, c = causal_lm_loss_sum(
            engine, batch["input_ids"], batch["attention_mask"], batch["labels"],
            packing=cfg.batching.packing,
        )  # fmt: skip
        if not real:
            continue
        nll += s.double().cpu()
        count += c.double().cpu()
    engine.train()
    nll, count = all_reduce_sum(nll), all_reduce_sum(count)
    loss = float(nll / count.clamp(min=1))
    return {"eval/loss": loss, "eval/ppl": math.exp(min(loss, 50.0))}


def build_model(cfg: SFTConfig):
    """The causal LM of ``--model_name_or_path`` (dropout, LoRA); under ZeRO-3 loaded partitioned
    across ranks (big models never fit whole)."""
    zero3 = None
    if cfg.ds.zero_stage == 3:
        zero3 = ds_config(
            zero_stage=3,
            dtype=cfg.model.dtype,
            micro_batch_size=cfg.optim.per_device_train_batch_size,
            inference=True,
        )
    return apply_lora(load_causal_lm(cfg.model, ds_zero3_config=zero3), cfg.model)


def train(cfg: SFTConfig) -> Path:
    run = setup_supervised(
        cfg,
        name="SFT",
        logger=log,
        models={"--model_name_or_path": cfg.model.model_name_or_path},
        build_dataset=build_sft_dataset,
        split="SFT split",
        unit="examples",
        build_model=functools.partial(build_model, cfg),
    )
    engine, plan, train_ds = run.engine, run.plan, run.train_ds
    collate = SFTCollator(run.tokenizer.pad_token_id)

    def train_step(micro_batch_indices: list[list[int]], step: int) -> dict[str, float]:
        """One optimizer step: the mean loss per supervised token of the global batch."""
        rows = {i: train_ds[i] for idx in micro_batch_indices for i in idx}
        budget = cfg.batching.max_tokens_per_micro_batch
        packed = cfg.batching.packing and packing_mode(engine) is not None
        micro_batch_indices = regroup(  # --max_tokens_per_micro_batch: by tokens
            micro_batch_indices, lambda i: len(rows[i]["input_ids"]), budget, packed=packed
        )
        micro_batches = [collate([rows[i] for i in idx]) for idx in micro_batch_indices]
        # 1. the number of supervised tokens in the whole optimizer step, over all ranks
        local = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
        n_tokens = all_reduce_sum(torch.tensor(float(local))).clamp(min=1.0)
        # 2. forward/backward each micro-batch; DeepSpeed averages gradients over ranks, hence × world
        loss_sum = torch.zeros(())
        for batch in accumulate(engine, micro_batches, explicit=budget > 0):
            batch = to_device(batch, engine.device)
            nll, _ = causal_lm_loss_sum(
                engine, batch["input_ids"], batch["attention_mask"], batch["labels"],
                packing=cfg.batching.packing,
            )  # fmt: skip
            engine.backward(nll * plan.world / n_tokens.to(nll.device), scale_wrt_gas=False)
            guarded_step(engine, step + 1, "model", nll)
            loss_sum += nll.detach().float().cpu()
        loss = float(all_reduce_sum(loss_sum) / n_tokens)
        return {"train/loss": loss, "train/tokens": float(n_tokens)}

    def save_model(step: int, path: Path, final: bool) -> None:
        """A plain HF causal-LM directory (LoRA merged), intermediate and final alike."""
        save_hf_causal_lm(
            engine.module,
            run.tokenizer,
            path,
            zero_stage=cfg.ds.zero_stage,
            run_config=run.run_config,
            ds_config=run.ds_json,
        )

    run.loop(
        desc="sft",
        train_step=train_step,
        evaluate=lambda: evaluate(engine, run.eval_ds, collate, cfg),
        save_model=save_model,
    )
    if is_main():
        log.info("SFT model saved to %s", run.out)
    return run.out


def main(argv: list[str] | None = None) -> None:
    run_stage(train, parse_config(SFTConfig, argv))


if __name__ == "__main__":
    run_program(main)
