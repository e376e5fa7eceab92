"""Metrics: TensorBoard scalars plus a ``metrics.jsonl`` file (rank 0 only).

The JSONL copy lets reports and plots read a run's curves without parsing TensorBoard event files.
Metric names are namespaced (``train/loss``, ``eval/ppl``, ``objective/kl``, ``macro/mean_len``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from marlhf.config import LoggingConfig
from marlhf.distributed import is_main


class Tracker:
    def __init__(self, cfg: LoggingConfig, subdir: str = ""):
        self.enabled = is_main()
        self.writer = None
        self.jsonl = None
        if not self.enabled:
            return
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(out / "metrics.jsonl", "a", buffering=1)
        if cfg.enable_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb = Path(cfg.tensorboard_path) if cfg.tensorboard_path else out / "tensorboard"
            self.writer = SummaryWriter(str(tb / subdir) if subdir else str(tb))

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        if self.writer is not None:
            for k, v in clean.items():
                self.writer.add_scalar(k, v, step)
        self.jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")

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
