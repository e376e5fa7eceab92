"""Checkpoints: Hugging Face directories that later stages load directly, and resumable training state.

Layout of a run's ``output_dir``::

    output_dir/                    final model as a standard HF directory (+ run_config.json, ds_config.json)
    output_dir/checkpoints/step-N/ HF directory of the model after optimizer step N (every --save_steps)
    output_dir/train_state/        DeepSpeed checkpoints (model, optimizer, scheduler) + our client
                                   state (step, epoch, data position, RNG, metrics) for --resume

The resolved run config and the DeepSpeed JSON are written next to every HF checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marlhf.distributed import barrier, is_main


def gather_state_dict(module: torch.nn.Module, zero_stage: int) -> dict[str, torch.Tensor] | None:
    """The full state dict on CPU at rank 0 (None elsewhere). Under ZeRO-3 every parameter is gathered
    one at a time, so peak memory stays at one full parameter beyond the partition."""
    if zero_stage == 3:
        import deepspeed

        out: dict[str, torch.Tensor] = {}
        for name, p in module.named_parameters():
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                if is_main():
                    out[name] = p.detach().cpu().clone()
        persistent = set(module.state_dict())  # non-persistent buffers are not checkpoint entries
        for name, b in module.named_buffers():
            if is_main() and name in persistent:
                out[name] = b.detach().cpu().clone()
        return out if is_main() else None
    if not is_main():
        return None
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


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
    LoRA weights are merged, so any stage or the inference script loads it with from_pretrained."""
    from marlhf.models import merge_lora_state_dict, unwrap_peft

    base, scaling = unwrap_peft(module)
    state = gather_state_dict(module, zero_stage)
    if is_main():
        assert state is not None
        if scaling is not None:
            state = merge_lora_state_dict(state, scaling)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        base.save_pretrained(path, state_dict=state)
        tokenizer.save_pretrained(path)
        gen = getattr(base, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(path)
        write_json(path / "run_config.json", run_config)
        write_json(path / "ds_config.json", ds_config)
    barrier()


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_train_state(
    engines: dict[str, Any], root: str | Path, step: int, client_state: dict, keep: int
) -> None:
    """DeepSpeed checkpoint of each engine (model, optimizer, scheduler) under ``root/<name>``, tagged
    ``step-N``, with ``client_state`` stored alongside. Keeps the newest ``keep`` tags."""
    root = Path(root)
    tag = f"step-{step}"
    for name, engine in engines.items():
        engine.save_checkpoint(str(root / name), tag=tag, client_state=client_state)
    if is_main():
        write_json(root / "latest.json", {"tag": tag, "step": step, "engines": sorted(engines)})
        for name in engines:
            tags = sorted(
                (p for p in (root / name).glob("step-*") if p.is_dir()),
                key=lambda p: int(p.name.split("-")[1]),
            )
            for old in tags[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier()


def find_resume(root: str | Path, resume: str) -> tuple[Path, str] | None:
    """Where to resume from: ``(train_state root, tag)`` or None. ``resume`` is auto | never | a path."""
    if resume == "never":
        return None
    root = Path(resume) if resume != "auto" else Path(root)
    latest = root / "latest.json"
    if not latest.exists():
        if resume != "auto":
            raise FileNotFoundError(f"--resume {resume}: no latest.json in {root}")
        return None
    with open(latest) as f:
        return root, json.load(f)["tag"]


def load_train_state(engines: dict[str, Any], root: Path, tag: str) -> dict:
    """Restore each engine from ``root/<name>/<tag>``; returns the client state."""
    client: dict = {}
    for name, engine in engines.items():
        path, client = engine.load_checkpoint(
            str(root / name), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"could not load checkpoint {root / name / tag}")
    return client
