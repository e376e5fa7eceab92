"""Saving a trained model as a directory every later stage and the inference script load: a causal
LM as a plain Hugging Face directory (``from_pretrained``), a reward model as a reward-model
directory (:func:`marlhf.models.reward_model.load_reward_model`); LoRA weights merged, ZeRO-3
partitions gathered, the run's config and DeepSpeed JSON beside the weights.

A model trained with LoRA over a frozen base also gets its peft adapter, in ``<model>/adapter/``:
``PeftModel.from_pretrained(base, "<model>/adapter")`` reproduces the saved model (for a reward
model or critic: its backbone, ``AutoModel``, whose value head is ``<model>/value_head.safetensors``).
Where the base trained too (``--lora_train_base``) no adapter is written (one over the untouched
base would not reproduce the model), and one left by an earlier save is removed."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from marlhf.models.lora import base_trained, merge_lora_state_dict, unwrap_peft
from marlhf.models.reward_model import RewardModelInfo, reward_info, save_reward_model_state
from marlhf.runtime.checkpoint import gather_state_dict, write_json
from marlhf.runtime.checkpoint_files import naming_write_errors
from marlhf.runtime.distributed import barrier, is_main

ADAPTER_DIR = "adapter"  # a LoRA run's peft adapter, next to the merged weights

log = logging.getLogger("marlhf.save")

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
    ``adapter_model.safetensors``), when its base is frozen (:func:`save_adapter`)."""
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
            if scaling is not None:  # for peft users (PeftModel.from_pretrained)
                save_adapter(module, peft_state, path)
            base.save_pretrained(path, state_dict=state)
            tokenizer.save_pretrained(path)
            gen = getattr(base, "generation_config", None)
            if gen is not None:
                gen.save_pretrained(path)
            write_json(path / "run_config.json", run_config)
            write_json(path / "ds_config.json", ds_config)
    barrier()


def save_adapter(peft_model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """``<path>/adapter/`` of a peft model from its gathered ``state`` (the peft model's keys),
    when its base is frozen; else no adapter, and one an earlier save left there is removed."""
    where = Path(path) / ADAPTER_DIR
    if base_trained(peft_model):
        if where.exists():
            shutil.rmtree(where)
        log.info("%s: no %s/ (the base weights trained too: --lora_train_base)", path, ADAPTER_DIR)
        return
    peft_model.save_pretrained(where, state_dict=state)


def save_reward_checkpoint(
    module: torch.nn.Module,
    tokenizer,
    path: str | Path,
    *,
    zero_stage: int,
    run_config: dict,
    ds_config: dict,
    info: RewardModelInfo | None = None,
    **fields,
) -> None:
    """Save a (possibly LoRA-wrapped, possibly ZeRO-3-partitioned) :class:`RewardModel` (a reward
    model or PPO's critic) as one reward-model directory that
    :func:`marlhf.models.reward_model.load_reward_model` reads, ``info`` (or its fields:
    :func:`marlhf.models.reward_model.reward_info`) in its ``reward_config.json``; LoRA weights are
    merged into the backbone, and the backbone's adapter is saved beside them
    (:func:`save_adapter`). Collective under ZeRO-3 (every rank calls it); rank 0 writes."""
    info = reward_info(info, **fields)
    _, scaling = unwrap_peft(module.backbone)
    state = gather_state_dict(module, zero_stage)
    if is_main():
        assert state is not None
        peft_state = state
        if scaling is not None:
            state = merge_lora_state_dict(state, scaling)
        save_reward_model_state(state, module.config, tokenizer, path, info=info)
        if scaling is not None:
            backbone = {
                k.removeprefix("backbone."): v
                for k, v in peft_state.items()
                if k.startswith("backbone.")
            }
            with naming_write_errors(Path(path), "reward-model adapter", _MODEL_THEN):
                save_adapter(module.backbone, backbone, Path(path))
        write_json(Path(path) / "run_config.json", run_config)
        write_json(Path(path) / "ds_config.json", ds_config)
    barrier()
