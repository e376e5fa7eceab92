"""What every stage does around its own loop: process group, seeding, logging, progress, resume."""

from __future__ import annotations

import logging
import os
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from marlhf.distributed import init_distributed, is_main, world_size


def setup_logging() -> None:
    # torch.distributed's deprecation notices fire on every ZeRO collective; once is plenty
    warnings.filterwarnings("once", category=FutureWarning, module="torch.distributed")
    level = logging.INFO if is_main() else logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed", "datasets", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start(ds_cfg, seed: int) -> None:
    """Initialise the process group (deepspeed launcher, torchrun, or plain python) and seeds."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    init_distributed(ds_cfg.local_rank, ds_cfg.dist_timeout_s)
    setup_logging()
    try:
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
    except ImportError:  # pragma: no cover
        pass
    seed_everything(seed)
    logging.getLogger("marlhf").info("world size %d", world_size())


def progress(total: int, initial: int, desc: str, disable: bool = False):
    """A tqdm bar on rank 0 (a no-op object elsewhere)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        disable=disable or not is_main(),
        dynamic_ncols=True,
        file=sys.stderr,
    )


def ensure_output_dir(path: str) -> Path:
    out = Path(path)
    if is_main():
        out.mkdir(parents=True, exist_ok=True)
    return out
