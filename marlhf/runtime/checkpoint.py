"""Checkpoints: Hugging Face directories that later stages load directly, and resumable training state.

Layout of a run's ``output_dir``::

    output_dir/                    final model as a standard HF directory (+ run_config.json, ds_config.json)
    output_dir/checkpoints/step-N/ HF directory of the model after optimizer step N (every --save_steps),
                                   written as .partial-step-N/ and renamed when complete
    output_dir/train_state/        DeepSpeed checkpoints (model, optimizer, scheduler) + our client
                                   state (step, epoch, data position, RNG, metrics) for --resume,
                                   each tag with the SHA-256 of its files (``checksums.json``)

The resolved run config and the DeepSpeed JSON are written next to every HF checkpoint. A resume
verifies the checksums and falls back to the newest complete checkpoint when the latest one is
damaged or unfinished (:func:`find_resume`); a full disk raises an error naming the path.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marlhf.runtime.checkpoint_files import (
    TagStatus,
    begin_tag,
    check_tag,
    clean_stale_temp_files,
    finish_tag,
    is_marked_incomplete,
    naming_write_errors,
)
from marlhf.runtime.distributed import all_reduce_sum, barrier, is_main, world_size

log = logging.getLogger("marlhf.runtime.checkpoint")


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
    with naming_write_errors(path, "file"):
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)


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


# --------------------------------------------------------------------------------------------------
# resumable training state
#
#   train_state/latest.json              {"tag": "step-N", "step": N, "engines": [...]}, written last
#   train_state/<engine>/step-N/         DeepSpeed's files + checksums.json (see checkpoint_files)
#
# A resume takes the tag latest.json names when it is complete; otherwise (latest.json missing,
# unreadable, or naming a damaged or unfinished tag) the newest complete tag, with a warning that
# names what was wrong. No usable tag at all is an error naming the directory; nothing is deleted.

_TAG = re.compile(r"^step-(\d+)$")
_RESUME_HELP = (
    "restore a checkpoint into it, point --resume at another train_state directory, or start "
    "over with --resume never (nothing is deleted; a new run rotates old checkpoints out as it "
    "saves)"
)


def _tag_step(name: str) -> int | None:
    m = _TAG.match(name)
    return int(m.group(1)) if m else None


def _engine_tags(root: Path, name: str) -> dict[int, Path]:
    """``{step: tag directory}`` of the ``step-N`` directories of engine ``name``."""
    d = root / name
    if not d.is_dir():
        return {}
    return {s: p for p in d.iterdir() if p.is_dir() and (s := _tag_step(p.name)) is not None}


def save_train_state(
    engines: dict[str, Any],
    root: str | Path,
    step: int,
    client_state: dict,
    keep: int,
    extra_files: dict[str, dict[str, Callable[[Path], None]]] | None = None,
) -> None:
    """DeepSpeed checkpoint of each engine (model, optimizer, scheduler) under ``root/<name>``, tagged
    ``step-N``, with ``client_state`` stored alongside, the files' checksums, and ``latest.json``
    written last. Keeps the newest ``keep`` complete tags up to ``step`` (older ones and unfinished
    ones below ``step`` are deleted; never the one just written). Collective (every rank calls it).
    A full disk raises ``OSError(ENOSPC)`` naming the tag; the earlier tags are left as they were.
    ``extra_files`` (``{engine: {file name: write(path)}}``): files of the trainer's own written by
    rank 0 into that engine's tag (e.g. PPO's EMA shadow), so they are checksummed, verified on
    resume and rotated with it."""
    root = Path(root)
    tag = f"step-{step}"
    for name, engine in engines.items():
        tag_dir = root / name / tag
        with naming_write_errors(
            tag_dir,
            "training state",
            f"{tag_dir} is incomplete (delete it to reclaim its space): a resume skips it and "
            "takes the newest complete checkpoint.",
        ):
            if is_main():
                begin_tag(tag_dir)
            barrier()
            engine.save_checkpoint(str(root / name), tag=tag, client_state=client_state)
            if is_main():
                for file_name, write in (extra_files or {}).get(name, {}).items():
                    write(tag_dir / file_name)
            finish_tag(tag_dir)
    if is_main():
        write_json(root / "latest.json", {"tag": tag, "step": step, "engines": sorted(engines)})
        for name in engines:
            _rotate(root / name, step, keep)
    barrier()


def _rotate(engine_dir: Path, step: int, keep: int) -> None:
    """Delete the tags of ``engine_dir`` at or below ``step`` beyond the newest ``keep`` finished ones,
    and the unfinished ones below ``step``. Tags above ``step`` (left by an attempt that got further
    before it stopped) stay: this run writes them again."""
    tags = sorted(
        ((s, p) for s, p in _engine_tags(engine_dir.parent, engine_dir.name).items() if s <= step),
        reverse=True,
    )
    finished = [p for _, p in tags if not is_marked_incomplete(p)]
    unfinished = [p for s, p in tags if s < step and is_marked_incomplete(p)]
    for old in finished[keep:] + unfinished:
        shutil.rmtree(old, ignore_errors=True)


def _read_latest(root: Path) -> tuple[str | None, str]:
    """The tag ``root/latest.json`` names, or ``(None, what is wrong with it)``."""
    path = root / "latest.json"
    if not path.exists():
        return None, f"{path} is missing"
    try:
        tag = json.loads(path.read_text())["tag"]
        if not isinstance(tag, str) or _tag_step(tag) is None:
            raise ValueError(f"tag {tag!r} is not step-N")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        return None, f"{path} is unreadable ({type(e).__name__}: {e})"
    return tag, ""


def _engine_names(root: Path, engines: list[str] | None) -> list[str]:
    """The engines a checkpoint under ``root`` must hold: ``engines`` when given, else those
    latest.json lists, else every subdirectory with ``step-N`` directories."""
    if engines:
        return sorted(engines)
    try:
        names = json.loads((root / "latest.json").read_text())["engines"]
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            return sorted(names)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        pass
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _engine_tags(root, p.name))


def _check_checkpoint(root: Path, names: list[str], tag: str) -> TagStatus:
    """The status of tag ``tag`` over all engines: the first problem, else complete / unverified."""
    status = TagStatus("complete")
    for name in names:
        s = check_tag(root / name / tag)
        if not s.usable:
            return s
        if s.state == "unverified":
            status = s
    return status


def _candidates(root: Path, names: list[str]) -> list[str]:
    """Tags any engine has, newest first."""
    steps = set().union(*(_engine_tags(root, n) for n in names)) if names else set()
    return [f"step-{s}" for s in sorted(steps, reverse=True)]


def _newest_usable(
    root: Path, names: list[str], skip: set[str], problems: list[str]
) -> tuple[str, TagStatus] | None:
    """The newest tag not in ``skip`` that is complete (or unverified); adds the problems of the
    tags it passes over to ``problems``."""
    for tag in _candidates(root, names):
        if tag in skip:
            continue
        status = _check_checkpoint(root, names, tag)
        if status.usable:
            return tag, status
        problems.append(status.reason)
    return None


def find_resume(
    root: str | Path, resume: str, engines: list[str] | None = None
) -> tuple[Path, str] | None:
    """Where to resume from: ``(train_state root, tag)`` or None. ``resume`` is auto | never | a path.

    ``root`` is the run's own ``train_state`` directory (inside its output_dir): stale temporaries
    of an interrupted save are deleted from the run's output_dir first, whatever ``resume`` is.
    The tag is the one ``latest.json`` names when its files match their checksums; otherwise the
    newest complete tag, with a warning naming what was wrong (``latest.json`` missing or
    unreadable, a file missing, truncated or modified, a save that did not finish). With no
    checkpoint at all: None (``auto``) or ``FileNotFoundError`` (a path); with checkpoints of which
    none is complete: ``RuntimeError`` naming the directory and each problem. ``engines``: the
    engine names a checkpoint must hold (default: those latest.json lists, else every engine
    directory). Collective when distributed (the checksum reading is shared between ranks).
    """
    clean_stale_temp_files(Path(root).parent)
    if resume == "never":
        return None
    root = Path(resume) if resume != "auto" else Path(root)
    names = _engine_names(root, engines)
    tag, latest_problem = _read_latest(root)
    if tag is None and not _candidates(root, names):
        if resume != "auto":
            raise FileNotFoundError(
                f"--resume {resume}: no checkpoint in {root} (no latest.json and no "
                "<engine>/step-N directories); pass the train_state directory of a run"
            )
        if root.joinpath("latest.json").exists():  # latest.json garbage and nothing else: say so
            raise RuntimeError(f"{latest_problem} and {root} holds no checkpoint; {_RESUME_HELP}")
        return None
    problems = [latest_problem] if tag is None else []
    if tag is not None:
        status = _check_checkpoint(root, names, tag)
        if status.usable:
            if status.state == "unverified" and is_main():
                log.info("resuming from %s without checksums: %s", root / tag, status.reason)
            return root, tag
        problems.append(status.reason)
    found = _newest_usable(root, names, {tag} if tag else set(), problems)
    if found is None:
        raise RuntimeError(
            f"no complete checkpoint to resume from in {root}: "
            + "; ".join(problems)
            + f". To go on: {_RESUME_HELP}"
        )
    if is_main():
        log.warning(
            "%s. Resuming from %s of %s instead, the newest complete checkpoint (the steps after "
            "it are trained again)",
            "; ".join(problems),
            found[0],
            root,
        )
    return root, found[0]


def _try_load(engines: dict[str, Any], root: Path, tag: str) -> tuple[dict | None, str]:
    """Load ``tag`` into every engine: ``(client state, "")`` or ``(None, the error)``. All ranks
    agree: a failure on one is a failure on all."""
    client: dict | None = None
    error = ""
    for name, engine in engines.items():
        try:
            path, client = engine.load_checkpoint(
                str(root / name), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
            )
            if path is None:
                error = f"DeepSpeed found no checkpoint in {root / name / tag}"
        except Exception as e:  # a damaged file raises anything from torch.load/pickle/DeepSpeed
            error = f"{root / name / tag}: {type(e).__name__}: {e}".strip()
        if error:
            break
    if world_size() > 1:
        failed = all_reduce_sum(torch.tensor([1.0 if error else 0.0]))
        if float(failed) > 0 and not error:
            error = f"{root / tag} failed to load on another rank"
    return (None, error) if error else (client, "")


def load_train_state(engines: dict[str, Any], root: Path, tag: str) -> dict:
    """Restore each engine from ``root/<name>/<tag>``; returns the client state.

    A tag that fails to load (a damaged file of a checkpoint without checksums, say) is reported
    with its path and the newest other usable tag is loaded instead (every engine again, so nothing
    of the failed attempt remains); when none loads, ``RuntimeError`` names each failure and what
    to do. Collective when distributed."""
    root = Path(root)
    names = sorted(engines)
    tried: set[str] = set()
    problems: list[str] = []
    current: str | None = tag
    while current is not None:
        tried.add(current)
        client, error = _try_load(engines, root, current)
        if client is not None:
            if problems and is_main():
                log.warning(
                    "could not load %s. Resumed from %s of %s instead",
                    "; ".join(problems),
                    current,
                    root,
                )
            return client
        problems.append(error)
        found = _newest_usable(root, names, tried, problems)
        current = found[0] if found else None
    raise RuntimeError(
        f"could not load a checkpoint from {root}: "
        + "; ".join(problems)
        + f". To go on: {_RESUME_HELP}"
    )
