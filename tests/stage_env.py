"""The environment of a stage (or any ``python -m marlhf...`` program) run as a subprocess in tests:
CPU, offline, one thread, its own ``MARLHF_HOME`` (the tiny model's cache) when given, and the
repository on ``PYTHONPATH``. ``tests/`` is on ``sys.path`` (its ``conftest.py``), so every test
module imports it as ``from stage_env import stage_env``."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stage_env(home: Path | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        TOKENIZERS_PARALLELISM="false",
    )
    if home is not None:
        env["MARLHF_HOME"] = str(home)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env
