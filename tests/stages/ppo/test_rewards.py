"""Bring your own reward in the real stage: a user's reward-function file and a reward server each
train PPO, MA-PPO and every critic-free estimator, a reasoning-gym task PPO, MA-PPO and GRPO, in
two-step runs of the tiny model trained one after another in one process
(``tests/support/ppo_matrix.py``: one start-up, about a second per run). The known functions' values appear in the metrics; a function
that returns NaN stops its run naming itself, the row and the value, or is counted with
``--reward_errors zero``.

Marked slow: 19 end-to-end runs behind one process start-up (about 25 s of CPU).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from marlhf.runtime.distributed import free_port
from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]
MATRIX = ROOT / "tests" / "support" / "ppo_matrix.py"
SERVER = ROOT / "scripts" / "reward_server.py"
pytestmark = pytest.mark.slow

# PPO (token-level gae), MA-PPO (gae over 3-token macro actions) and every critic-free estimator
# (over macro actions too); the reasoning-gym task with PPO, MA-PPO and GRPO
ESTIMATORS = ("ppo", "mappo", "grpo", "dr_grpo", "rloo", "reinforce_pp", "macro_mc")
CASES = [(r, e) for r in ("fn", "server") for e in ESTIMATORS]
CASES += [("gym", e) for e in ("ppo", "mappo", "grpo")]

USER_FILE = """
import asyncio

def const(prompts, completions, **columns):
    return [0.25] * len(completions)

async def answer_len(prompts, completions, answer):
    await asyncio.sleep(0)
    return [float(len(a)) for a in answer]

def nan_for_all(prompts, completions, **columns):
    return [float("nan")] * len(completions)
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The data, the reward file and the reference server (503 to its first two requests)."""
    base = tmp_path_factory.mktemp("rewards")
    rows = [{"prompt": f"What is {i} plus {42 - i}?\nAnswer:", "answer": "42"} for i in range(40)]
    (base / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (base / "my_rewards.py").write_text(USER_FILE)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), "--fail_first", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout.readline().startswith("listening on")
    for _ in range(50):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    yield base, f"http://127.0.0.1:{port}/score"
    server.kill()
    server.wait()


def _common(base: Path, arm: str) -> list[str]:
    est = "gae" if arm in ("ppo", "mappo") else arm
    G = 1 if est in ("gae", "reinforce_pp", "macro_mc") else 2
    flags = [
        "--actor_model_name_or_path", "tiny-base", "--data_output_path", str(base / "cache"),
        "--data_split", "0,0,1", "--max_prompt_seq_len", "64", "--max_answer_seq_len", "8",
        "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
        "--advantage_estimator", est, "--n_samples_per_prompt", str(G), "--max_steps", "2",
        "--disable_progress_bar",
    ]  # fmt: skip
    if arm != "ppo":
        flags += ["--termination_condition", "fixed", "--ngram", "3"]  # macro actions
    if est == "macro_mc":
        flags += ["--mc_rollouts", "2", "--mc_max_boundaries", "1"]
    return flags


def _reward_flags(base: Path, url: str, reward: str) -> list[str]:
    """The documented commands' reward flags (docs/guide/rewards.md)."""
    qa = ["--data_path", str(base / "qa.jsonl")]
    if reward == "fn":
        fns = [f"{base}/my_rewards.py:const", f"{base}/my_rewards.py:answer_len"]
        return [*qa, "--reward_fn", fns[0], "--reward_fn", fns[1], "--reward_weights", "1,0.5"]
    if reward == "server":
        return [*qa, "--reward_url", url, "--reward_batch_size", "3", "--reward_concurrency", "2"]
    return ["--data_path", "reasoning-gym:basic_arithmetic:60"]


@pytest.fixture(scope="module")
def matrix(setup):
    base, url = setup
    cases, outs = {}, {}
    for reward, arm in CASES:
        name = f"{reward}-{arm}"
        outs[name] = base / "runs" / name
        flags = [*_common(base, arm), *_reward_flags(base, url, reward)]
        cases[name] = [*flags, "--output_dir", str(outs[name])]
    nan = [f"{base}/my_rewards.py:nan_for_all", f"{base}/my_rewards.py:const"]
    for errors in ("raise", "zero"):
        name = f"nan-{errors}"
        outs[name] = base / "runs" / name
        cases[name] = [
            *_common(base, "grpo"), "--data_path", str(base / "qa.jsonl"),
            "--reward_fn", nan[0], "--reward_fn", nan[1], "--reward_errors", errors,
            "--output_dir", str(outs[name]),
        ]  # fmt: skip
    spec = base / "cases.json"
    spec.write_text(json.dumps(cases))
    proc = run_python(
        [sys.executable, str(MATRIX), str(spec)],
        env=stage_env(base / "home"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    errors = json.loads((base / "cases.json.errors.json").read_text())
    return outs, errors, proc.stderr


@pytest.mark.parametrize(("reward", "arm"), CASES)
def test_each_reward_trains_every_estimator(matrix, reward, arm):
    outs, errors, _ = matrix
    name = f"{reward}-{arm}"
    assert name not in errors, errors.get(name)
    out = outs[name]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert (out / "actor" / "config.json").exists()
    run = json.loads((out / "run_config.json").read_text())
    # what ran: --reward_source auto resolved
    assert run["ppo"]["reward_source"] == ("reasoning-gym" if reward == "gym" else "none")
    for row in rows:
        assert math.isfinite(row["loss/policy"])
        assert (row["macro/max_len"] == 1) == (arm == "ppo")  # token-level PPO, else macro actions
        if reward == "fn":
            # const gives 0.25, answer_len len("42") = 2 weighted 0.5 (its column reached it)
            assert row["reward/const"] == 0.25 and row["reward/answer_len"] == 2.0
            assert row["objective/score"] == pytest.approx(0.25 + 0.5 * 2.0)
        elif reward == "server":
            # the reference server: 1 when the answer "42" is in the response; every row scored
            assert row["reward/server/scored"] == 1.0
            assert row["objective/score"] == pytest.approx(row["reward/server"])
            assert 0.0 <= row["reward/server"] <= 1.0
        else:
            assert 0.0 <= row["reward/reasoning-gym"] <= 1.0
            assert row["objective/score"] == pytest.approx(row["reward/reasoning-gym"])


def test_a_function_returning_nan_stops_the_run_or_is_counted(matrix):
    outs, errors, _ = matrix
    assert "nan-raise" in errors
    last = errors["nan-raise"].strip().splitlines()[-1]
    assert last.startswith("marlhf.rewards.registry.RewardError: --reward_fn ")
    assert "nan_for_all, row 0 of the batch (prompt 'What is" in last and "returned nan" in last
    assert read_metrics(outs["nan-raise"] / "metrics.jsonl") == []  # no step trained on it
    assert "nan-zero" not in errors, errors.get("nan-zero")
    for row in read_metrics(outs["nan-zero"] / "metrics.jsonl"):
        # every NaN counted and scored 0: the reward is const's 0.25 alone
        assert row["reward/errors"] == 4.0 and row["objective/score"] == pytest.approx(0.25)
