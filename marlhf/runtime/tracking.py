"""Metrics: TensorBoard scalars plus a ``metrics.jsonl`` file (rank 0 only).

The JSONL copy lets reports and plots read a run's curves without parsing TensorBoard event files.
Metric names are namespaced (``train/loss``, ``eval/ppl``, ``objective/kl``, ``macro/mean_len``).

A run started at ``start_step`` (the step of the checkpoint it resumed from, 0 for a fresh start)
logs every step after it again, so the rows of later steps that a killed run had logged are dropped
first: ``metrics.jsonl`` keeps its rows with ``step <= start_step`` (rewritten atomically, only when
something goes) and TensorBoard hides the old events from ``start_step + 1`` on (``purge_step``).
Readers then see one row per step and metric. The JSONL is strict JSON: a non-finite value is
written as ``null`` there (TensorBoard gets the value itself).

``--report_to`` adds trackers: TensorBoard (the default), Weights & Biases (``wandb``, imported only
when asked; ``WANDB_MODE=offline`` logs without an account) and trackio (local, under
``$TRACKIO_DIR``). Both log the run under ``--run_name`` (default: what ran, e.g. ``MA-PPO n=5``, and
the output directory's name) in ``--tracker_project``, with the run's configuration; a resumed run
continues the same run (its id is derived from the output directory).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

from marlhf.config import LoggingConfig
from marlhf.runtime.distributed import is_main

log = logging.getLogger(__name__)


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Keep the rows of ``path`` with ``step <= last_step``, in order; return how many were dropped.

    A line that is not JSON (the torn last write of a killed process) is dropped too. The file is
    replaced atomically (a temporary file in the same directory, then ``os.replace``), so a crash
    here leaves either the old or the new file; an untouched file is not rewritten.
    """
    path = Path(path)
    if not path.exists():
        return 0
    keep, dropped = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if row.get("step", 0) <= last_step:
                keep.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.writelines(keep)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return dropped


def _import_tracker(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ValueError(
            f"--report_to {name}: the {name} package is not installed (pip install {name}, or "
            "pip install 'ma-rlhf[trackers]'); or leave it out of --report_to"
        ) from None


def _run_id(out: Path) -> str:
    """A stable id of the run in ``out`` (wandb's run id: a resumed run continues the same run)."""
    return hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:16]


class Tracker:
    """Rank 0's metrics sink.

    ``start_step``: the step the run starts from (its resumed checkpoint's, 0 for a fresh start);
    rows and events of later steps, from an earlier attempt, are dropped. ``run_name``: the run's
    name in wandb / trackio (``--run_name`` wins); ``config``: the run's resolved configuration,
    logged with it.
    """

    def __init__(
        self,
        cfg: LoggingConfig,
        subdir: str = "",
        start_step: int = 0,
        run_name: str | None = None,
        config: dict | None = None,
    ):
        self.enabled = is_main()
        self.writer = None
        self.jsonl = None
        self.wandb = None
        self.trackio = None
        if not self.enabled:
            return
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        report_to = set(cfg.report_to) - {"none"}
        # optional packages first: a missing one stops the run before anything is written
        wandb = _import_tracker("wandb") if "wandb" in report_to else None
        trackio = _import_tracker("trackio") if "trackio" in report_to else None
        dropped = truncate_metrics(out / "metrics.jsonl", start_step)
        if dropped:
            log.info("metrics.jsonl: %d rows after step %d dropped", dropped, start_step)
        self.jsonl = open(out / "metrics.jsonl", "a", buffering=1)
        if cfg.enable_tensorboard and "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            tb = Path(cfg.tensorboard_path) if cfg.tensorboard_path else out / "tensorboard"
            # events of steps >= purge_step in earlier files are hidden by TensorBoard's readers
            self.writer = SummaryWriter(
                str(tb / subdir) if subdir else str(tb), purge_step=start_step + 1
            )
        name = cfg.run_name or (f"{run_name} {out.name}" if run_name else out.name)
        self.name = name
        if wandb is not None:
            self.wandb = wandb.init(
                project=cfg.tracker_project,
                name=name,
                id=_run_id(out),
                resume="allow",
                dir=str(out),
                config=config,
            )
        if trackio is not None:
            trackio.init(project=cfg.tracker_project, name=name, config=config, resume="allow")
            self.trackio = trackio

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        if self.writer is not None:
            for k, v in clean.items():
                self.writer.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(clean, step=step)
        if self.trackio is not None:
            self.trackio.log(clean, step=step)
        # strict JSON: a non-finite value (e.g. an entropy threshold of +inf) is written as null
        row = {k: (v if math.isfinite(v) else None) for k, v in clean.items()}
        self.jsonl.write(
            json.dumps({"step": step, "time": time.time(), **row}, allow_nan=False) + "\n"
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
        if self.trackio is not None:
            self.trackio.finish()
            self.trackio = None
        if self.jsonl is not None:
            self.jsonl.close()


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a run's ``metrics.jsonl``."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
