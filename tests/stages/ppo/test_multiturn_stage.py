"""Multi-turn PPO (``--env``) end to end, the stage as a process on CPU with ``tiny-base-trail``:
an environment from a file whose rows raise, hang, return the wrong types, never say done or fail
to start (``--env_errors zero_reward``: counted in ``env/errors``, the others trained; ``fail``:
one ``error:`` line naming the environment, the row and the turn), skyrl-gym's
``gsm8k_multi_turn`` (mechanics only), and a run killed with SIGKILL after a checkpoint that
resumes to the uninterrupted run's numbers bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]
FAKES = ROOT / "tests" / "support" / "fake_envs.py"
pytestmark = pytest.mark.slow

COMMON = [
    "--actor_model_name_or_path", "tiny-base-trail", "--max_answer_seq_len", "8",
    "--per_device_training_batch_size", "2", "--disable_progress_bar", "--temperature", "1.0",
    "--top_k", "0", "--max_total_seq_len", "256",
]  # fmt: skip


def _cmd(out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "marlhf.stages.ppo", *COMMON, "--output_dir", str(out), *flags]


def _run(out: Path, *flags: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = run_python(
        _cmd(out, *flags), env=stage_env(), capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _rows(path: Path, plans: dict[str, dict]) -> Path:
    with open(path, "w") as f:
        for rid, extra in plans.items():
            f.write(json.dumps({"id": rid, "prompt": f"start {rid}", **extra}) + "\n")
    return path


PLANS = {
    "fine": {"plan": [{"obs": "ok ({})", "reward": 0.5}, {"obs": None, "reward": 1.0, "done": True}]},
    "raises": {"plan": [{"raise": "boom"}]},
    "hangs": {"plan": [{"obs": "wait", "reward": 0.25}, {"hang": True}]},
    "wrong": {"plan": [{"return": "not a dict"}]},
    "endless": {"plan": []},
    "no_start": {"init_raise": "no world"},
}  # fmt: skip


def test_environment_errors_timeouts_and_a_done_that_never_comes(tmp_path):
    rows = _rows(tmp_path / "rows.jsonl", PLANS)
    env = ["--env", f"{FAKES}:Scripted", "--data_path", str(rows), "--max_turns", "3"]
    flags = [*env, "--env_timeout_s", "5", "--env_workers", "3", "--max_steps", "1",
             "--per_device_generation_batch_size", "6", "--termination_condition", "turn",
             "--no_eos_own_macro", "--value_function", "start"]  # fmt: skip
    _run(tmp_path / "zero", *flags, "--env_errors", "zero_reward")
    (m,) = read_metrics(tmp_path / "zero" / "metrics.jsonl")
    # raises, hangs (stopped at the timeout), wrong return type, init failure: four errors
    assert m["env/errors"] == 4.0
    assert m["env/stopped_max_turns"] == pytest.approx(1 / 6)  # endless: at --max_turns 3
    assert m["env/done"] == pytest.approx(1 / 6)  # fine
    # the rewards the rows earned before they ended: 1.5 + 0.25 (+ 0 for the failed turns)
    assert m["objective/score"] == pytest.approx(1.75 / 6, abs=1e-6)
    assert m["env/turns"] == pytest.approx((2 + 1 + 2 + 1 + 3 + 0) / 6)
    for key in ("loss/policy", "loss/value", "macro/count", "policy/entropy"):
        assert key in m and m[key] == m[key], key  # trained, finite
    proc = _run(tmp_path / "fail", *flags, ok=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # rows play in parallel: whichever error comes first stops the run, named with its row
    assert lines[0].startswith("error: --env Scripted: prompt row ")
    assert any(
        s in lines[0]
        for s in (
            "prompt row no_start: init raised RuntimeError: no world",
            "prompt row raises, turn 1: step raised RuntimeError: boom",
            "prompt row wrong, turn 1: step returned 'not a dict' (str); it must be a dict",
        )
    ), lines[0]


def test_skyrl_gyms_gsm8k_multi_turn_trains(tmp_path):
    rows = _rows(
        tmp_path / "gsm8k.jsonl",
        {
            f"q{i}": {
                "prompt": [
                    {"role": "user", "content": f"What is {i} plus {i}? Answer after ####."}
                ],
                "env_class": "gsm8k_multi_turn",
                "reward_spec": {"method": "rule", "ground_truth": str(2 * i)},
            }
            for i in range(4)
        },
    )
    flags = ["--env", "gsm8k_multi_turn", "--data_path", str(rows), "--max_turns", "2",
             "--env_timeout_s", "0", "--max_steps", "1", "--per_device_generation_batch_size",
             "4", "--advantage_estimator", "grpo", "--n_samples_per_prompt", "2"]  # fmt: skip
    _run(tmp_path / "gsm8k", *flags)
    (m,) = read_metrics(tmp_path / "gsm8k" / "metrics.jsonl")
    assert m["env/errors"] == 0.0 and 1.0 <= m["env/turns"] <= 2.0
    assert "loss/policy" in m and m["response/length"] > 0


def test_a_run_killed_after_a_checkpoint_resumes_bit_identically(tmp_path):
    flags = ["--env", "marlhf-trail-4", "--data_path", "marlhf-trail-4:64", "--env_timeout_s",
             "10", "--per_device_generation_batch_size", "4", "--max_steps", "4", "--save_steps",
             "1", "--termination_condition", "turn", "--no_eos_own_macro", "--value_function",
             "start", "--actor_learning_rate", "1e-4"]  # fmt: skip
    _run(tmp_path / "full", *flags)
    full = {r["step"]: r for r in read_metrics(tmp_path / "full" / "metrics.jsonl")}
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        _cmd(out, *flags), env=stage_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    latest = out / "train_state" / "latest.json"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and json.loads(latest.read_text())["step"] >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its environments' processes
    proc.wait()
    killed_at = json.loads(latest.read_text())["step"]
    assert 2 <= killed_at < 4
    _run(out, *flags)
    resumed = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in range(killed_at + 1, 5):
        for key in ("objective/score", "objective/gold", "objective/kl", "loss/policy",
                    "loss/value", "response/length", "env/turns", "macro/count"):  # fmt: skip
            assert resumed[step][key] == full[step][key], (step, key)
