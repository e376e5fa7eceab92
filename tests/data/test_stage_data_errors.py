"""A stage run as a subprocess on data that leaves a phase empty: one clear error, nothing cached
(issue 13, item 3). The data-layer tests (``test_tokenize.py``) cover the cases one by one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_sft_stage_with_an_empty_phase_fails_clearly_every_time(tmp_path):
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        TOKENIZERS_PARALLELISM="false",
        MARLHF_HOME=str(tmp_path / "home"),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    cache = tmp_path / "data_cache"
    cmd = [sys.executable, "-m", "marlhf.stages.sft", "--model_name_or_path", "tiny"]
    cmd += ["--data_split", "0,5,5", "--max_samples", "50", "--data_output_path", str(cache)]
    cmd += ["--output_dir", str(tmp_path / "out"), "--max_steps", "1"]
    for _ in range(2):  # the re-run fails the same way: nothing empty was cached
        run = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert run.returncode == 2
        assert "IndexError" not in run.stderr and "Traceback" not in run.stderr
        assert "no train SFT examples for phase 1 (SFT)" in run.stderr
        assert "phase 1 (SFT) has weight 0 in --data_split 0,5,5" in run.stderr
        assert not cache.exists() or not any(cache.iterdir())
