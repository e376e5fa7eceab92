"""The environment of a stage (or any ``python -m marlhf...`` program) run as a subprocess in tests:
CPU, offline, one thread, its own ``MARLHF_HOME`` (the tiny model's cache) when given, and the
repository on ``PYTHONPATH``. ``tests/`` is on ``sys.path`` (its ``conftest.py``), so every test
module imports it as ``from stage_env import stage_env``."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.forked import run_python

ROOT = Path(__file__).resolve().parents[2]


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


def run_stage(cmd: list[str], home: Path | None = None, timeout: int = 900):
    """Run ``cmd`` (a stage's command line) in :func:`stage_env` from the repository root (forked:
    ``tests/support/forked.py``); fails the test with the tail of its output unless it exits 0.
    Returns the completed process."""
    proc = run_python(
        cmd, env=stage_env(home), capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc
