"""What a resumed run must share with its checkpoint: the settings that change what is trained.

Every resumable checkpoint holds ``run_settings.json`` (in its engine directory, checksummed with
it): the run's flags (by flag name, :func:`marlhf.cli.flag_values`) and the sizes derived from them
and the number of processes (the global batch). A run that resumes compares its own settings with
those of the checkpoint it resumes from (:func:`check_resume_settings`, before any model is
loaded):

- *harmless* settings may change: logging, trackers, run names, paths and progress
  (``HARMLESS``; a ``--config`` file counts by the values it sets, like flags), and how a step is
  computed without changing what it computes (``--length_groups``, ``--generation_backend``,
  ``--gradient_checkpointing``, ...);
- the per-device batch sizes are compared through the global sizes they make with the number of
  processes (``DERIVED``): 2 processes x 4 rows and 1 process x 8 rows train the same steps, while
  a different number of processes with the same per-device sizes changes every step (and where
  each step is in the data);
- any other difference stops the run with the list of differences, unless
  ``--resume_with_changes`` is given: then the run resumes with its own settings, warns, and appends
  the changes to ``<output_dir>/run_history.jsonl`` (its later checkpoints hold the new settings);
- except the settings the engine state of a checkpoint is laid out for (:func:`unresumable`): the
  precision (``--dtype``, PPO's ``--bf16``), what is trained with LoRA (``--lora_dim``,
  ``--lora_module_name``, whether the base trains too) and the ZeRO stage (but 1 <-> 2, which
  share a layout). A change to one of them is refused even with ``--resume_with_changes``,
  saying that the checkpoint cannot be resumed so and how to start from its model instead.

Checkpoints saved without ``run_settings.json`` (by older versions) are resumed unchecked.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from marlhf.runtime.distributed import is_main

log = logging.getLogger("marlhf.checkpoint")

SETTINGS_FILE = "run_settings.json"
HISTORY_FILE = "run_history.jsonl"

# Flags whose value does not change what a run trains.
HARMLESS = frozenset(
    {
        # logging, paths, progress
        "output_dir", "enable_tensorboard", "tensorboard_path", "save_steps", "keep_checkpoints",
        "eval_interval", "eval_iters", "log_interval", "resume", "resume_with_changes",
        "disable_progress_bar", "data_output_path", "print_answers", "print_answers_interval",
        "log_phase_resources", "local_rank", "dist_timeout_s", "report_to", "run_name",
        "tracker_project", "allow_settings_mismatch",
        # how a step is computed, not what it computes (equal up to float rounding)
        "gradient_checkpointing", "actor_gradient_checkpointing", "critic_gradient_checkpointing",
        "generation_backend", "compile_generation", "enable_zero3_generation_gather",
        "recompute_old_logprobs", "score_all_positions", "length_groups",
        "length_group_call_tokens", "reuse_critic_forward", "per_device_eval_batch_size",
        "packing", "max_tokens_per_micro_batch",
        # compared through the global sizes they make (DERIVED)
        "per_device_train_batch_size", "per_device_generation_batch_size", "generation_batches",
        "per_device_training_batch_size",
    }
)  # fmt: skip
# The global sizes: name -> how the message names it.
DERIVED = {
    "global_batch": "the global batch (per-device batch x accumulation x processes)",
    "rollout_batch": "the responses per PPO step (per-device generation batch x generation "
    "batches x processes)",
    "minibatch": "the PPO minibatch (per-device training batch x processes)",
}


def settings(flags: dict[str, Any], derived: dict[str, int]) -> dict:
    """What a checkpoint records: the flags (``{name: value}``, :func:`marlhf.cli.flag_values`)
    and the derived global sizes."""
    return {"flags": dict(flags), "derived": dict(derived)}


def settings_writer(record: dict):
    """A ``write(path)`` for :func:`marlhf.checkpoint.save_train_state`'s ``extra_files``."""

    def write(path: Path) -> None:
        path.write_text(json.dumps(record, indent=1, sort_keys=True, default=str))

    return write


def differences(saved: dict, now: dict) -> list[tuple[str, Any, Any]]:
    """``(name, checkpoint's value, this run's value)`` of every setting that changes what is
    trained; ``name`` is ``--flag`` or a :data:`DERIVED` key."""
    out = []
    old_flags, new_flags = saved.get("flags", {}), now.get("flags", {})
    for name in sorted(set(old_flags) | set(new_flags)):
        if name in HARMLESS or name not in old_flags or name not in new_flags:
            continue  # a flag one of the versions did not have: nothing to compare
        if old_flags[name] != new_flags[name]:
            out.append((f"--{name}", old_flags[name], new_flags[name]))
    old_derived, new_derived = saved.get("derived", {}), now.get("derived", {})
    for name in sorted(set(old_derived) & set(new_derived)):
        if old_derived[name] != new_derived[name]:
            out.append((name, old_derived[name], new_derived[name]))
    return out


def _dtype(flags: dict) -> Any:
    """The precision a run trains in (PPO's ``--bf16`` is ``--dtype bf16``)."""
    return "bf16" if flags.get("bf16") else flags.get("dtype")


def _trains_base(flags: dict, prefix: str) -> bool | None:
    """Whether a model with LoRA (``--{prefix}lora_dim`` > 0) trains its base weights too
    (``--lora_train_base``; a checkpoint saved before that flag: without ``--only_optimize_lora``);
    None for a model without LoRA."""
    if not flags.get(f"{prefix}lora_dim"):
        return None
    if "lora_train_base" in flags:
        return bool(flags["lora_train_base"])
    return not flags.get("only_optimize_lora", False)


def unresumable(saved: dict, now: dict) -> list[str]:
    """What a resume cannot change, with why: the settings a checkpoint's engine state is laid out
    for. DeepSpeed keeps a precision's own optimizer state (fp32 master weights and a loss scale in
    bf16/fp16, none in fp32), the parameters follow the LoRA setting and the optimizer's groups what
    is trained, and the partitioned files the ZeRO stage (stages 1 and 2 share theirs)."""
    old, new = saved.get("flags", {}), now.get("flags", {})
    out = []
    if "dtype" in old and "dtype" in new and _dtype(old) != _dtype(new):
        out.append(
            f"--dtype {_dtype(old)} -> {_dtype(new)} (the optimizer state is kept for the "
            "precision it was trained in)"
        )
    for prefix in ("", "actor_", "critic_"):
        for name in ("lora_dim", "lora_module_name"):
            key = f"{prefix}{name}"
            if key not in old or key not in new or old[key] == new[key]:
                continue
            if name == "lora_dim" or old.get(f"{prefix}lora_dim") or new.get(f"{prefix}lora_dim"):
                out.append(f"--{key} {json.dumps(old[key])} -> {json.dumps(new[key])} (the "
                           "checkpoint's parameters are those of its LoRA setting)")  # fmt: skip
        if f"{prefix}lora_dim" in old and f"{prefix}lora_dim" in new:
            before, after = _trains_base(old, prefix), _trains_base(new, prefix)
            if None not in (before, after) and before != after:
                out.append(
                    f"--lora_train_base {json.dumps(before)} -> {json.dumps(after)} for the "
                    f"{prefix.rstrip('_') or 'model'}'s LoRA (the optimizer holds the parameters "
                    "it trained)"
                )
        key = f"{prefix}zero_stage"
        if key in old and key in new and old[key] != new[key] and {old[key], new[key]} != {1, 2}:
            out.append(f"--{key} {old[key]} -> {new[key]} (the checkpoint's files are laid out "
                       "for its ZeRO stage; only 1 and 2 share theirs)")  # fmt: skip
    return out


def describe(changes: list[tuple[str, Any, Any]]) -> str:
    parts = []
    for name, old, new in changes:
        label = DERIVED.get(name, name)
        parts.append(f"{label} {json.dumps(old)} -> {json.dumps(new)}")
    return "; ".join(parts)


def saved_flags(root: Path, tag: str) -> dict:
    """The flags recorded with checkpoint ``tag`` under the train_state directory ``root`` ({}
    when it holds none)."""
    for path in sorted(Path(root).glob(f"*/{tag}/{SETTINGS_FILE}")):
        try:
            return dict(json.loads(path.read_text()).get("flags", {}))
        except (OSError, ValueError, AttributeError):
            continue
    return {}


def _latest_settings(root: Path) -> tuple[str, dict] | None:
    """``(tag, settings)`` of the checkpoint ``root/latest.json`` names, else of the newest tag
    that holds settings; None when there are none."""
    tags: list[str] = []
    try:
        tags.append(json.loads((root / "latest.json").read_text())["tag"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if root.is_dir():
        found = {p.parent.name for p in root.glob(f"*/step-*/{SETTINGS_FILE}")}
        tags += sorted(found, key=lambda t: int(t.split("-", 1)[1]), reverse=True)
    for tag in tags:
        for path in sorted(root.glob(f"*/{tag}/{SETTINGS_FILE}")):
            try:
                return tag, json.loads(path.read_text())
            except (OSError, ValueError):
                continue
    return None


def check_resume_settings(
    state_root: Path, resume: str, accept: bool, now: dict, output_dir: Path
) -> list[tuple[str, Any, Any]]:
    """Compare this run's settings ``now`` (:func:`settings`) with those of the checkpoint it will
    resume from (under ``state_root``, or the train_state directory ``--resume`` names); returns
    the differences. Without ``accept`` (``--resume_with_changes``) any difference raises
    ``ValueError`` listing them; with it, they are logged and appended to the run's history on
    rank 0. Nothing to compare (``--resume never``, no checkpoint, one saved without settings):
    ``[]``."""
    if resume == "never":
        return []
    root = Path(state_root) if resume == "auto" else Path(resume)
    found = _latest_settings(root)
    if found is None:
        return []
    tag, saved = found
    fixed = unresumable(saved, now)
    if fixed:
        raise ValueError(
            f"{tag} of {root}: these changes cannot be resumed, even with --resume_with_changes: "
            + "; ".join(fixed)
            + ". Resume with the checkpoint's settings, or start a new run from its model with "
            "these (its final or checkpoints/step-N model as --model_name_or_path, and --resume "
            "never or another --output_dir)"
        )
    changes = differences(saved, now)
    if not changes:
        return []
    listed = describe(changes)
    if not accept:
        raise ValueError(
            f"resuming {tag} of {root} with settings that change what is trained: {listed}. Pass "
            "the checkpoint's settings to resume as it was, --resume_with_changes to resume with "
            f"these (recorded in {Path(output_dir) / HISTORY_FILE}), or --resume never (or "
            "another --output_dir) to start over"
        )
    if is_main():
        log.warning("resuming %s of %s with changed settings: %s", tag, root, listed)
        record = {
            "time": time.time(),
            "resumed_from": str(root / tag),
            "changes": [{"setting": n, "checkpoint": o, "now": v} for n, o, v in changes],
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        }
        with open(Path(output_dir) / HISTORY_FILE, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
    return changes
