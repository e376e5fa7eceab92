"""The environment of a stage run as a subprocess in tests: CPU, offline, one thread, its own
``MARLHF_HOME`` (the tiny model's cache) and the repository on ``PYTHONPATH``."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stage_env(home: Path) -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        MARLHF_HOME=str(home),
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env
