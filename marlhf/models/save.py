"""Saving a trained model as a directory every later stage and the inference script load: a causal
LM as a plain Hugging Face directory (``from_pretrained``), a reward model as a reward-model
directory (:func:`marlhf.models.reward_model.load_reward_model`); LoRA weights merged, ZeRO-3
partitions gathered, the run's config and DeepSpeed JSON beside the weights."""

from __future__ import annotations

from pathlib import Path

import torch

from marlhf.models.lora import merge_lora_state_dict, unwrap_peft
from marlhf.models.reward_model import save_reward_model_state
from marlhf.runtime.checkpoint import gather_state_dict, write_json
from marlhf.runtime.checkpoint_files import naming_write_errors
from marlhf.runtime.distributed import barrier, is_main

ADAPTER_DIR = "adapter"  # a LoRA run's peft adapter, next to the merged weights

# what a failed model save means for a resume (the training state of a step is saved after its model)
_MODEL_THEN = "A resume starts from the last complete training state, before this model's step."


def save_hf_causal_lm(
    module: torch.nn.Module,
    tokenizer,
    path: str | Path,
    *,
    zero_stage: int,
    run_config: dict,
    ds_config: dict,
) -> None:
    """Save a (possibly peft-wrapped, possibly ZeRO-3-partitioned) causal LM as a plain HF directory:
    LoRA weights are merged, so any stage or the inference script loads it with from_pretrained; a
    peft model's adapter is saved as well, in ``<path>/adapter/`` (``adapter_config.json``,
    ``adapter_model.safetensors``)."""
    base, scaling = unwrap_peft(module)
    state = gather_state_dict(module, zero_stage)
    if is_main():
        assert state is not None
        path = Path(path)
        peft_state = state
        if scaling is not None:
            state = merge_lora_state_dict(state, scaling)
        with naming_write_errors(path, "model checkpoint", _MODEL_THEN):
            path.mkdir(parents=True, exist_ok=True)
            if (
                scaling is not None
            ):  # the adapter itself too, for peft users (PeftModel.from_pretrained)
                module.save_pretrained(path / ADAPTER_DIR, state_dict=peft_state)
            base.save_pretrained(path, state_dict=state)
            tokenizer.save_pretrained(path)
            gen = getattr(base, "generation_config", None)
            if gen is not None:
                gen.save_pretrained(path)
            write_json(path / "run_config.json", run_config)
            write_json(path / "ds_config.json", ds_config)
    barrier()


def save_reward_checkpoint(
    module: torch.nn.Module,
    tokenizer,
    path: str | Path,
    *,
    zero_stage: int,
    rm_type: str,
    run_config: dict,
    ds_config: dict,
    score_stats=None,
    normalizer=None,
    termination=None,
    extra: dict | None = None,
) -> None:
    """Save a (possibly LoRA-wrapped, possibly ZeRO-3-partitioned) :class:`RewardModel` as one
    reward-model directory that :func:`marlhf.models.reward_model.load_reward_model` reads; LoRA weights are
    merged into the backbone. Collective under ZeRO-3 (every rank calls it); rank 0 writes."""
    _, scaling = unwrap_peft(module.backbone)
    state = gather_state_dict(module, zero_stage)
    if is_main():
        assert state is not None
        if scaling is not None:
            state = merge_lora_state_dict(state, scaling)
        save_reward_model_state(
            state,
            module.config,
            tokenizer,
            path,
            rm_type=rm_type,
            score_stats=score_stats,
            normalizer=normalizer,
            termination=termination,
            extra=extra,
        )
        write_json(Path(path) / "run_config.json", run_config)
        write_json(Path(path) / "ds_config.json", ds_config)
    barrier()
