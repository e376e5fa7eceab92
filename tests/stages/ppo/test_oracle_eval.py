"""The oracle reward on a long task straight from a shipped base (no reward-model directory: the
critic is the base's backbone with a fresh value head), with held-out evaluations
(``--eval_interval``) that log ``eval/*`` and leave the training exactly as it is without them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from marlhf.pipeline.preflight import main as preflight_main
from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]
FLAGS = [
    "--actor_model_name_or_path", "tiny-base-64", "--reward_source", "gold",
    "--data_path", "synthetic-facts-64", "--max_prompt_seq_len", "256",
    "--max_answer_seq_len", "16", "--per_device_generation_batch_size", "4",
    "--per_device_training_batch_size", "2", "--max_steps", "2", "--disable_progress_bar",
]  # fmt: skip


def test_preflight_takes_the_embedded_base_and_blames_the_flags_given(capsys):
    assert preflight_main(["ppo", *FLAGS]) == 0
    capsys.readouterr()
    # with the learned reward (the default) the base has no value head to give the critic: the
    # message names the flag that was passed (the actor's), not --critic_model_name_or_path
    assert preflight_main(["ppo", *FLAGS[:2], "--data_path", "synthetic-facts-64"]) == 2
    err = capsys.readouterr().err
    assert (
        "preflight: --actor_model_name_or_path tiny-base-64 (the critic's default: "
        "--critic_model_name_or_path not given): not a reward-model directory"
    ) in err
    assert (
        "--critic_value_head fresh" in err and "--critic_model_name_or_path tiny-base-64" not in err
    )
    assert "does not exist" not in err


def _ppo(out: Path, home: Path, *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "marlhf.stages.ppo", *FLAGS, "--output_dir", str(out), *extra]
    cmd += ["--data_output_path", str(out.parent / "cache")]
    run = run_python(
        cmd, env=stage_env(home), capture_output=True, text=True, cwd=ROOT, timeout=900
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "critic: the backbone of tiny-base-64 with a fresh value head" in run.stderr
    return read_metrics(out / "metrics.jsonl")


@pytest.mark.slow
def test_oracle_ppo_from_the_base_with_held_out_evaluations(tmp_path):
    home = tmp_path / "home"
    rows = _ppo(tmp_path / "eval", home, "--eval_interval", "1", "--eval_iters", "1")
    evals = [r for r in rows if "eval/reward" in r]
    assert [r["step"] for r in evals] == [1, 2]
    for r in evals:
        assert set(r) >= {"eval/reward", "eval/gold", "eval/response_len", "eval/ends_with_eos"}
        assert "eval/score" not in r  # no reward model in this run
        assert r["eval/reward"] == pytest.approx(r["eval/gold"])  # the oracle is the reward
        assert 0 < r["eval/response_len"] <= 16
    critic = tmp_path / "eval" / "critic"
    assert json.loads((critic / "reward_config.json").read_text())["role"] == "critic"
    # the same run without evaluations trains exactly the same steps
    plain = _ppo(tmp_path / "plain", home)
    assert not [r for r in plain if "eval/reward" in r]

    def training(rs):
        return [
            {k: v for k, v in r.items() if not k.startswith(("eval/", "time", "mem/"))}
            for r in rs
            if "eval/reward" not in r
        ]

    got, want = training(rows), training(plain)
    assert [r["step"] for r in got] == [1, 2]
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k
