"""Multi-turn PPO (``--env``) with ``macro_mc`` on two ranks (``torchrun``, gloo on CPU) under
ZeRO-3, whose sharded actor makes forward passes collective, on rows whose episodes end at
different turns: each step one rank plays a row of 1 turn, the other a row of 4 (``Tally``), so
the ranks sample in different numbers of rounds, their continuations too.

- ``--enable_zero3_generation_gather`` (the default, the static decoder): the gathered actor's
  forward passes are local to each rank (:func:`marlhf.runtime.engine.gathered_for_generation`);
  the run logs the metrics of the same run under ZeRO-2 (a whole actor on each rank, nothing
  collective in generation), up to float rounding;
- without it (``hf`` on the partitioned actor, each call collective): the rank whose row ends
  first keeps answering the other's calls (:meth:`marlhf.envs.turns.TurnSampler.keep_in_step`)
  and the run completes with both rows' whole episodes and every continuation counted.

An environment that fails on one rank (an exception under ``--env_errors fail``, or an answer
``macro_mc`` cannot replay) stops both ranks, each with one line
(:func:`marlhf.envs.turns.raise_together`).

A run that falls out of step hangs in a collective or fails on a mismatched one: each run has
a time limit."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from marlhf.runtime.distributed import free_port
from marlhf.runtime.tracking import read_metrics
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]
FAKES = ROOT / "tests" / "support" / "fake_envs.py"
pytestmark = pytest.mark.slow

FLAGS = [
    "--actor_model_name_or_path", "tiny-base-trail", "--max_answer_seq_len", "8",
    "--disable_progress_bar", "--temperature", "1.0", "--top_k", "0",
    "--max_total_seq_len", "256", "--env", f"{FAKES}:Tally", "--env_timeout_s", "0",
    "--max_turns", "4", "--per_device_generation_batch_size", "1",
    "--per_device_training_batch_size", "1", "--max_steps", "2",
    "--termination_condition", "turn", "--advantage_estimator", "macro_mc",
    "--mc_rollouts", "2", "--mc_max_boundaries", "2", "--mc_boundary_selection", "spread",
]  # fmt: skip
RUNS = {
    "zero2": ("--actor_zero_stage", "2"),
    "gathered": ("--actor_zero_stage", "3"),
    "partitioned": ("--actor_zero_stage", "3", "--enable_zero3_generation_gather", "false"),
}


def _stderr_once_ended(proc: subprocess.Popen, limit_s: int, late: str) -> str:
    """``proc``'s standard error once it has ended; past ``limit_s`` its ranks are killed and the
    test fails with ``late``."""
    try:
        return proc.communicate(timeout=limit_s)[1]
    except subprocess.TimeoutExpired:
        # the ranks run in sessions of their own and take SIGTERM as "stop after this step"
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.communicate()
        pytest.fail(f"{late} within {limit_s} s")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    """Each run of :data:`RUNS` on two ranks: its logged metrics, one dict per step."""
    base = tmp_path_factory.mktemp("env_ranks")
    rows = base / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"id": i, "prompt": "count", "turns": n}) + "\n"
            for i, n in (("a", 1), ("b", 4))
        )
    )
    out = {}
    for name, flags in RUNS.items():
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(free_port()), "-m", "marlhf.stages.ppo", *FLAGS,
            "--data_path", str(rows), "--output_dir", str(base / name), *flags,
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, env=stage_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=ROOT,
        )  # fmt: skip
        err = _stderr_once_ended(proc, 240, f"{name}: the two ranks did not finish (out of step)")
        assert proc.returncode == 0, (name, err[-5000:])
        out[name] = read_metrics(base / name / "metrics.jsonl")
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_both_ranks_play_their_whole_episodes_and_continuations(runs, name):
    metrics = runs[name]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        # one row per rank: 1 turn and 4, both done
        assert m["env/turns"] == 2.5 and m["env/done"] == 1.0 and m["env/errors"] == 0.0
        # K = 2 continuations at each boundary (mc/boundaries: per row) and at each row's
        # prompt (G = 1), both ranks'
        assert m["mc/continuations"] == 2 * (2 * m["mc/boundaries"] + 2)
        for key in ("loss/policy", "policy/entropy", "objective/score", "objective/kl"):
            assert math.isfinite(m[key]), (name, key)
    assert sum(m["mc/boundaries"] for m in metrics) > 0


def test_the_gathered_zero3_run_logs_the_zero2_runs_metrics(runs):
    for got, ref in zip(runs["gathered"], runs["zero2"], strict=True):
        keys = {k for k in ref if not k.startswith("time")}
        assert keys == {k for k in got if not k.startswith("time")}
        for k in sorted(keys):
            assert got[k] == pytest.approx(ref[k], rel=1e-4, abs=1e-5), (got["step"], k)


# one row's environment raises at its first step; the other row plays 4 turns on the other rank
FAILING_ROWS = [
    {"id": "a", "prompt": "count", "plan": [{"raise": "the tool broke"}]},
    {"id": "b", "prompt": "count", "plan": [{"obs": "go on", "reward": 0.0, "done": False}] * 3
     + [{"obs": "end", "reward": 1.0, "done": True}]},
]  # fmt: skip
STOPPED = (
    "stopped: the environment of rank {r} failed (that rank's error line says which environment, "
    "row and turn)"
)


def _failing_run(tmp_path, flags: list[str], rows: list[dict]) -> dict[int, str]:
    """The two ranks' run on ``rows`` with ``flags``, which must fail within 120 s with one error
    line from each rank: each rank's line after its ``error: rank R: ``, by rank."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(free_port()), "-m", "marlhf.stages.ppo", *flags,
        "--data_path", str(path), "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=stage_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    err = _stderr_once_ended(proc, 120, "the ranks did not stop")
    assert proc.returncode != 0
    # no rank died in a collective its peer had left (gloo: "Connection closed by peer")
    assert not [line for line in err.splitlines() if line.startswith("[rank")], err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 2, err[-3000:]
    by_rank = {int(line.split()[2].rstrip(":")): line.split(": ", 2)[2] for line in lines}
    assert sorted(by_rank) == [0, 1], lines
    return by_rank


@pytest.mark.parametrize("name", ["zero2", "partitioned"])
def test_an_environment_error_on_one_rank_stops_every_rank_with_a_line(tmp_path, name):
    flags = FLAGS[: FLAGS.index("--advantage_estimator")]  # the default estimator: no continuations
    flags[flags.index(f"{FAKES}:Tally")] = f"{FAKES}:Scripted"
    said = _failing_run(tmp_path, [*flags, *RUNS[name]], FAILING_ROWS)
    r = next(k for k, line in said.items() if "the tool broke" in line)
    assert said[r] == (
        "--env Scripted: prompt row a, turn 1: step raised RuntimeError: the tool broke"
    )
    assert said[1 - r] == STOPPED.format(r=r)


def test_an_environment_macro_mc_cannot_replay_on_one_rank_stops_every_rank(tmp_path):
    flags = list(FLAGS)
    flags[flags.index(f"{FAKES}:Tally")] = f"{FAKES}:UnreplayableRow"
    rows = [
        {"id": "a", "prompt": "count", "turns": 3, "random": True},
        {"id": "b", "prompt": "count", "turns": 3},
    ]
    said = _failing_run(tmp_path, [*flags, *RUNS["partitioned"]], rows)
    r = next(k for k, line in said.items() if "replaying" in line)
    assert said[r].startswith(f"--env {FAKES}:UnreplayableRow: prompt row a, turn 1: replaying")
    assert said[1 - r] == STOPPED.format(r=r)
