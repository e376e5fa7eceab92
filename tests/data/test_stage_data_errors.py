"""A stage run as a subprocess on data that leaves a phase empty: one clear error, nothing cached.
The data-layer tests (``test_tokenize.py``) cover the cases one by one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.forked import run_python
from tests.support.stage_env import stage_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path) -> dict:
    return stage_env(tmp_path / "home")


def test_sft_stage_with_an_empty_phase_fails_clearly_every_time(tmp_path):
    env = _env(tmp_path)
    cache = tmp_path / "data_cache"
    cmd = [sys.executable, "-m", "marlhf.stages.sft", "--model_name_or_path", "tiny"]
    cmd += ["--data_split", "0,5,5", "--max_samples", "50", "--data_output_path", str(cache)]
    cmd += ["--output_dir", str(tmp_path / "out"), "--max_steps", "1"]
    for _ in range(2):  # the re-run fails the same way: nothing empty was cached
        run = run_python(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert run.returncode == 2
        assert "IndexError" not in run.stderr and "Traceback" not in run.stderr
        assert "no train SFT examples for phase 1 (SFT)" in run.stderr
        assert "phase 1 (SFT) has weight 0 in --data_split 0,5,5" in run.stderr
        assert not cache.exists() or not any(cache.iterdir())


def test_two_ranks_on_a_fresh_home_and_bad_data_fail_once_and_clearly(tmp_path):
    """Two ranks under the deepspeed launcher, first use of ``tiny`` (each rank builds a copy: every
    copy must hold the weights, not only rank 0's) and data that leave the SFT phase empty: rank 0
    reports the error once, rank 1 learns of it and exits instead of waiting, exit status 2."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2"]
    cmd += ["--master_port", str(port), "--module", "marlhf.stages.sft"]
    cmd += ["--model_name_or_path", "tiny", "--data_split", "0,5,5", "--max_samples", "50"]
    cmd += ["--data_output_path", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out")]
    cmd += ["--max_steps", "1", "--dist_timeout_s", "120"]
    run = run_python(
        cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    text = run.stdout + run.stderr
    assert run.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        "error: no train SFT examples for phase 1 (SFT): the set would be empty, "
        "and an empty set is never cached"
    ), errors
    assert "give it a positive weight" in errors[0], errors
    (model,) = (tmp_path / "home" / "tiny").glob("gemma-*")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (model / name).is_file(), sorted(p.name for p in model.iterdir())
