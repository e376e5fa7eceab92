"""SIGTERM and Ctrl-C (``marlhf.runtime.preemption``): before training a signal stops at once; during
training the step is finished, every rank saves a resumable checkpoint of it, one line says so and
the exit status is 128 + the signal; a second signal (past the launcher's echo) stops at once; a
signal that reaches one rank only stops all of them after the same step."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from marlhf.runtime import preemption
    from marlhf.stages.common import run_stage

    def train(cfg):
        preemption.install()
        if sys.argv[1] == "setup":  # loading models: nothing to save, the signal stops at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
            print("not reached")
        preemption.enter_training()
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # a launcher passing the terminal's Ctrl-C on
        time.sleep(0.2)
        assert preemption.stop_requested() == signal.SIGINT
        print("one request, the step goes on", flush=True)
        time.sleep(preemption.REPEAT_WINDOW_S + 0.5)  # a long step; the user presses again
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
        print("not reached")

    run_stage(train, None)
    """
)


def test_signal_before_training_stops_at_once_and_a_second_one_during_it_too(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text(SCRIPT)
    env = stage_env()
    t0 = time.monotonic()
    setup = run_python(
        [sys.executable, str(script), "setup"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert setup.returncode == 128 + signal.SIGTERM, setup.stderr
    assert setup.stderr.strip().splitlines()[-1] == (
        "stopped by SIGTERM before training began; nothing was saved"
    )
    assert "not reached" not in setup.stdout and "Traceback" not in setup.stderr
    training = run_python(
        [sys.executable, str(script), "training"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert training.returncode == 128 + signal.SIGINT, training.stderr
    assert training.stdout.splitlines() == ["one request, the step goes on"]
    assert training.stderr.strip().splitlines()[-1] == (
        "stopped by a second SIGINT: exiting at once, without a checkpoint"
    )
    assert "KeyboardInterrupt" not in training.stderr
    assert time.monotonic() - t0 < 100  # neither slept its 30 s


def _sft_cmd(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    cmd = ["-m", "marlhf.stages.sft", "--model_name_or_path", "tiny", "--max_samples", "40"]
    cmd += ["--per_device_train_batch_size", "2", "--max_steps", "60", "--save_steps", "50"]
    cmd += ["--data_output_path", str(tmp_path / "cache"), "--output_dir", str(out)]
    return [*cmd, "--disable_progress_bar", *extra]


def _signal_after_first_step(proc: subprocess.Popen, out: Path, send) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().strip():
            send()
            return
        time.sleep(0.05)
    pytest.fail("the run ended (or hung) before its first step was logged")


def _train_steps(out: Path) -> list[int]:
    from marlhf.runtime.tracking import read_metrics

    return [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_of_the_step_and_the_same_command_resumes(tmp_path):
    out, home = tmp_path / "sft", tmp_path / "home"
    cmd = [sys.executable, *_sft_cmd(tmp_path, out)]
    proc = subprocess.Popen(
        cmd, env=stage_env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        _signal_after_first_step(proc, out, lambda: proc.send_signal(signal.SIGINT))
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    step = json.loads((out / "train_state" / "latest.json").read_text())["step"]
    assert 1 <= step < 60
    line = err.strip().splitlines()[-1]
    assert line == (
        f"stopped by SIGINT after step {step} of 60: a resumable checkpoint is in "
        f"{out / 'train_state'} (step-{step}); run the same command to resume"
    )
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert (out / "train_state" / "model" / f"step-{step}" / "checksums.json").is_file()
    assert _train_steps(out) == list(range(1, step + 1))
    again = run_python(cmd, env=stage_env(home), cwd=ROOT, capture_output=True, text=True,
                           timeout=900)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {out / 'train_state'} at step {step}" in again.stderr
    assert _train_steps(out) == list(range(1, 61))


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_after_the_same_step(tmp_path):
    import psutil

    out, home = tmp_path / "sft", tmp_path / "home"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(port), *_sft_cmd(tmp_path, out, "--dist_timeout_s", "120")]
    proc = subprocess.Popen(
        cmd, env=stage_env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    def signal_rank_1() -> None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                is_stage = "marlhf.stages.sft" in child.cmdline()
                if is_stage and child.environ().get("RANK") == "1":
                    child.send_signal(signal.SIGTERM)
                    return
            except psutil.Error:
                continue
        pytest.fail("rank 1 not found")

    try:
        _signal_after_first_step(proc, out, signal_rank_1)
        stdout, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    text = stdout + err
    assert proc.returncode != 0
    assert (out / "train_state" / "latest.json").exists(), text[-5000:]
    step = json.loads((out / "train_state" / "latest.json").read_text())["step"]
    assert 1 <= step < 60
    stops = [x for x in text.splitlines() if x.startswith("stopped by SIGTERM after step")]
    assert stops == [
        f"stopped by SIGTERM after step {step} of 60: a resumable checkpoint is in "
        f"{out / 'train_state'} (step-{step}); run the same command to resume"
    ], text[-3000:]
    assert (out / "train_state" / "model" / f"step-{step}" / "checksums.json").is_file()
    assert _train_steps(out) == list(range(1, step + 1))
