"""Metrics: TensorBoard scalars plus a ``metrics.jsonl`` file (rank 0 only).

The JSONL copy lets reports and plots read a run's curves without parsing TensorBoard event files.
Metric names are namespaced (``train/loss``, ``eval/ppl``, ``objective/kl``, ``macro/mean_len``).

A run started at ``start_step`` (the step of the checkpoint it resumed from, 0 for a fresh start)
logs every step after it again, so the rows of later steps that a killed run had logged are dropped
first: ``metrics.jsonl`` keeps its rows with ``step <= start_step`` (rewritten atomically, only when
something goes) and TensorBoard hides the old events from ``start_step + 1`` on (``purge_step``).
Readers then see one row per step and metric. The JSONL is strict JSON: a non-finite value is
written as ``null`` there (TensorBoard gets the value itself).
"""

from __future__ import annotations

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


class Tracker:
    """Rank 0's metrics sink.

    ``start_step``: the step the run starts from (its resumed checkpoint's, 0 for a fresh start);
    rows and events of later steps, from an earlier attempt, are dropped.
    """

    def __init__(self, cfg: LoggingConfig, subdir: str = "", start_step: int = 0):
        self.enabled = is_main()
        self.writer = None
        self.jsonl = None
        if not self.enabled:
            return
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        dropped = truncate_metrics(out / "metrics.jsonl", start_step)
        if dropped:
            log.info("metrics.jsonl: %d rows after step %d dropped", dropped, start_step)
        self.jsonl = open(out / "metrics.jsonl", "a", buffering=1)
        if cfg.enable_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb = Path(cfg.tensorboard_path) if cfg.tensorboard_path else out / "tensorboard"
            # events of steps >= purge_step in earlier files are hidden by TensorBoard's readers
            self.writer = SummaryWriter(
                str(tb / subdir) if subdir else str(tb), purge_step=start_step + 1
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        if self.writer is not None:
            for k, v in clean.items():
                self.writer.add_scalar(k, v, step)
        # strict JSON: a non-finite value (e.g. an entropy threshold of +inf) is written as null
        row = {k: (v if math.isfinite(v) else None) for k, v in clean.items()}
        self.jsonl.write(
            json.dumps({"step": step, "time": time.time(), **row}, allow_nan=False) + "\n"
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
        if self.jsonl is not None:
            self.jsonl.close()


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a run's ``metrics.jsonl``."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
