"""One run per output directory (``marlhf.runtime.run_lock``): the lock names its holder, a dead holder's
lock is taken over, the ranks of one run share one lock (also where the directory is node-local),
and a second stage or demo on a directory in use stops with one line naming the holder's PID."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from marlhf.runtime.run_lock import (
    LOCK_FILE,
    Holder,
    OutputDirInUse,
    acquire,
    holder_alive,
    read_holder,
    release,
)
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


def _sleeper() -> subprocess.Popen:
    """A live process of this host that is not this one (the holder of a foreign lock)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _write_lock(directory: Path, **fields) -> Path:
    holder = {
        "pid": 1,
        "host": socket.gethostname(),
        "boot_id": "",
        "started": "",
        "since": time.time(),
        "command": "python -m marlhf.stages.ppo --output_dir x",
        "token": "other-run",
        **fields,
    }
    path = directory / LOCK_FILE
    path.write_text(json.dumps(holder))
    return path


def test_second_holder_is_refused_naming_the_pid_and_release_frees_it(tmp_path):
    proc = _sleeper()
    try:
        from marlhf.runtime.run_lock import _process_start

        _write_lock(tmp_path, pid=proc.pid, started=_process_start(proc.pid))
        with pytest.raises(OutputDirInUse) as err:
            acquire(tmp_path, "mine")
        text = str(err.value)
        assert f"--output_dir {tmp_path} is in use by another run: PID {proc.pid} on host" in text
        assert "marlhf.stages.ppo" in text and str(tmp_path / LOCK_FILE) in text
    finally:
        proc.kill()
        proc.wait()
    # the holder is gone now: its lock is stale and taken over
    path = acquire(tmp_path, "mine")
    assert read_holder(path).pid == os.getpid() and read_holder(path).token == "mine"
    assert acquire(tmp_path, "mine") == path  # another rank of the same run: accepted
    release(path, "someone-else")
    assert path.exists()  # not the holder's token: left alone
    release(path, "mine")
    assert not path.exists()


def test_stale_locks_dead_pid_reused_pid_reboot_and_foreign_host(tmp_path):
    me = Holder(
        os.getpid(), socket.gethostname(), "boot-a", "1", time.time(), "x", "t"
    )  # this process, as recorded
    from marlhf.runtime.run_lock import _boot_id, _process_start

    live = Holder(me.pid, me.host, _boot_id(), _process_start(me.pid), me.since, "x", "t")
    assert holder_alive(live) is True
    dead = run_python([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True).stdout  # fmt: skip
    assert holder_alive(Holder(int(dead), me.host, "", "", 0.0, "x", "t")) is False
    # the same PID, started at another time: the PID was reused, the holder is gone
    reused = Holder(me.pid, me.host, "", str(int(_process_start(me.pid)) + 7), 0.0, "x", "t")
    assert holder_alive(reused) is False
    if _boot_id():  # the host rebooted since the lock was taken
        assert holder_alive(Holder(me.pid, me.host, "other-boot", "", 0.0, "x", "t")) is False
    # another host cannot be checked from here: never taken over
    other = Holder(me.pid, "some-other-host", "", "", 0.0, "x", "t")
    assert holder_alive(other) is None
    _write_lock(tmp_path, host="some-other-host", pid=4242)
    with pytest.raises(
        OutputDirInUse, match="PID 4242 on host some-other-host .*cannot be checked"
    ):
        acquire(tmp_path, "mine")
    # an unreadable lock file older than the grace period is taken over
    (tmp_path / LOCK_FILE).write_text("garbage")
    old = time.time() - 60
    os.utime(tmp_path / LOCK_FILE, (old, old))
    assert read_holder(acquire(tmp_path, "mine")).token == "mine"


# --- ranks ---------------------------------------------------------------------------------------
RANKS = textwrap.dedent(
    """
    import os, sys, torch
    from pathlib import Path
    torch.distributed.init_process_group("gloo")
    r = torch.distributed.get_rank()
    node_local = sys.argv[2] == "node-local"
    if node_local:  # each rank plays the first rank of its own node, on its own disk
        os.environ["LOCAL_RANK"] = "0"
    directory = Path(sys.argv[1]) / (f"node{r}" if node_local else "shared") / "run"
    from marlhf.runtime.run_lock import OutputDirInUse, lock_output_dir, read_holder, LOCK_FILE
    try:
        lock_output_dir(directory)
    except OutputDirInUse as e:
        print(f"rank {r} refused: {e}", flush=True)
        torch.distributed.destroy_process_group()
        sys.exit(3)
    holder = read_holder(directory / LOCK_FILE)
    print(f"rank {r} locked {directory} pid {holder.pid} token {holder.token}", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    """
)


def _locks(stdout: str) -> list[tuple[str, str, str, str]]:
    """(rank, directory, pid, token) of every "rank R locked DIR pid P token T" the ranks printed;
    found anywhere in the output, since two ranks' lines can interleave in the launcher's pipe."""
    return re.findall(r"rank (\d) locked (\S+) pid (\d+) token ([0-9a-f]{32})", stdout)


def _two_ranks(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(port), str(script), str(tmp_path), mode]
    return run_python(cmd, env=stage_env(), capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_ranks_of_one_run_share_one_lock_and_node_local_dirs_get_their_own(tmp_path):
    shared = _two_ranks(tmp_path, "shared")
    assert shared.returncode == 0, shared.stdout + shared.stderr[-3000:]
    locks = _locks(shared.stdout)
    assert len(locks) == 2, shared.stdout
    assert (
        len({pid for _, _, pid, _ in locks}) == 1
    )  # rank 0's lock, seen by rank 1: one lock per run, not per rank
    assert not (tmp_path / "shared" / "run" / LOCK_FILE).exists()  # released at exit

    local = _two_ranks(tmp_path, "node-local")
    assert local.returncode == 0, local.stdout + local.stderr[-3000:]
    locks = _locks(local.stdout)
    tokens = {token for _, _, _, token in locks}
    assert len(locks) == 2 and len(tokens) == 1, (
        local.stdout
    )  # each node's own lock, one run's token
    assert len({pid for _, _, pid, _ in locks}) == 2

    # another run holds node 1's directory: every rank stops, not only rank 1
    proc = _sleeper()
    try:
        from marlhf.runtime.run_lock import _process_start

        (tmp_path / "node1" / "run").mkdir(parents=True, exist_ok=True)
        _write_lock(tmp_path / "node1" / "run", pid=proc.pid, started=_process_start(proc.pid))
        held = _two_ranks(tmp_path, "node-local")
    finally:
        proc.kill()
        proc.wait()
    refused = re.findall(r"rank \d refused: .*?PID (\d+)", held.stdout)
    assert refused == [str(proc.pid)] * 2, held.stdout
    assert not (tmp_path / "node0" / "run" / LOCK_FILE).exists()  # rank 0 let its lock go


# --- stages and the demo -------------------------------------------------------------------------
def _sft(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "marlhf.stages.sft", "--model_name_or_path", "tiny"]
    cmd += ["--data_output_path", str(tmp_path / "cache"), "--output_dir", str(out)]
    return [*cmd, "--max_samples", "40", "--disable_progress_bar", *extra]


@pytest.mark.slow
def test_second_sft_on_a_directory_in_use_stops_naming_the_holder(tmp_path):
    """Two SFT runs on one --output_dir: the second stops at once with one line naming the first's
    PID, and the first goes on untouched (stopped by SIGTERM here, its metrics one row per step).
    The demo refuses a directory in use the same way, before --fresh deletes anything."""
    import signal

    out = tmp_path / "sft"
    env = stage_env(tmp_path / "home")
    first = subprocess.Popen(
        _sft(tmp_path, out, "--max_steps", "100000", "--per_device_train_batch_size", "2"),
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # the first run holds the lock and has logged a step (the second starts in a second or two)
        logged = out / "metrics.jsonl"
        while first.poll() is None and not (logged.exists() and "train/loss" in logged.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (out / LOCK_FILE).exists()
        second = run_python(
            _sft(tmp_path, out, "--max_steps", "1", "--seed", "99"),
            env=env, capture_output=True, text=True, cwd=ROOT, timeout=600,
        )  # fmt: skip
        assert first.poll() is None, "the first run ended before the second tried"
        first.send_signal(signal.SIGTERM)
        _, first_err = first.communicate(timeout=600)
    finally:
        first.kill()
    errors = [x for x in second.stderr.splitlines() if x.startswith("error:")]
    assert second.returncode == 2, second.stderr[-3000:]
    assert len(errors) == 1 and f"PID {first.pid} on host" in errors[0], second.stderr[-3000:]
    assert "Traceback" not in second.stderr and "[rank0]" not in second.stderr
    assert first.returncode == 128 + signal.SIGTERM, first_err[-3000:]
    from marlhf.runtime.tracking import read_metrics

    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, len(steps) + 1)) and steps
    assert json.loads((out / "run_config.json").read_text())["optim"]["seed"] == 1234
    assert not (out / LOCK_FILE).exists()  # released when the first run ended

    proc = _sleeper()
    try:
        from marlhf.runtime.run_lock import _process_start

        demo = tmp_path / "demo"
        demo.mkdir()
        _write_lock(demo, pid=proc.pid, started=_process_start(proc.pid))
        run = run_python(
            [sys.executable, "-m", "marlhf.demo", "--output_dir", str(demo), "--fresh"],
            env=env, capture_output=True, text=True, cwd=ROOT, timeout=300,
        )  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.startswith(f"error: --output_dir {demo} is in use by another run: PID")
    assert sorted(p.name for p in demo.iterdir()) == [LOCK_FILE]  # --fresh deleted nothing


def _immutable(path: Path) -> bool:
    """Make ``path`` immutable (``chattr +i``); False where that is not possible here."""
    try:
        done = run_python(["chattr", "+i", str(path)], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


def test_an_output_dir_that_cannot_be_written_is_one_error_naming_it(tmp_path):
    """A regular file, a path under one, a read-only or an immutable directory: one
    ``OutputDirUnusable`` (an input error) naming the directory and why; the file is untouched."""
    from marlhf.runtime.run_lock import OutputDirUnusable, lock_output_dir

    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    with pytest.raises(OutputDirUnusable, match=rf"^--output_dir {file}: is a file, not a dir"):
        lock_output_dir(file)
    with pytest.raises(OutputDirUnusable, match=rf"^--output_dir {file}/run: {file} is a file"):
        lock_output_dir(file / "run")
    assert file.read_text() == "keep me"

    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    if not os.access(read_only, os.W_OK):  # not as root, who writes anyway
        with pytest.raises(OutputDirUnusable, match=r"cannot write there \(Permission denied"):
            lock_output_dir(read_only)
        with pytest.raises(OutputDirUnusable, match=rf"^--output_dir {read_only}/run: cannot"):
            lock_output_dir(read_only / "run")
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    if not _immutable(frozen):
        pytest.skip("chattr +i is not available here")
    try:
        with pytest.raises(OutputDirUnusable) as err:
            lock_output_dir(frozen)
        assert str(err.value).startswith(f"--output_dir {frozen}: cannot write there (")
        assert f"{frozen}/{LOCK_FILE})" in str(err.value)
    finally:
        run_python(["chattr", "-i", str(frozen)], check=True)


def test_a_stage_or_the_demo_on_a_file_as_output_dir_stops_with_one_line(tmp_path):
    file = tmp_path / "out"
    file.write_text("keep me")
    env = stage_env(tmp_path / "home")
    for cmd in (
        _sft(tmp_path, file, "--max_steps", "1"),
        [sys.executable, "-m", "marlhf.demo", "--output_dir", str(file)],
    ):
        run = run_python(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
        errors = [x for x in run.stderr.splitlines() if x.startswith("error:")]
        assert run.returncode == 2, run.stderr[-3000:]
        assert errors == [f"error: --output_dir {file}: is a file, not a directory; pass a "
                          "directory (it is created when missing)"], run.stderr[-3000:]  # fmt: skip
        assert "Traceback" not in run.stderr and "[rank0]" not in run.stderr
    assert file.read_text() == "keep me"
