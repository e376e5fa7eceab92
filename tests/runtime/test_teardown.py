"""A finished stage leaves no process-group thread behind (two ranks under ``torchrun``, gloo on
CPU, ZeRO 0, 2 and 3): what aborted a rank at interpreter exit, now and then, after its run was
done and saved ("terminate called without an active exception"; see
:func:`marlhf.runtime.distributed.shutdown_distributed`).

``torch.distributed.destroy_process_group`` alone leaves the groups' threads running here (measured
with this probe: 3 of gloo's threads at ZeRO 0 and 2, 6 at ZeRO 3, held by DeepSpeed's clone of the
world group, the engines and ``torch.distributed.nn``'s default arguments)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marlhf.runtime.distributed import free_port
from tests.support.stage_env import stage_env

PROBE = Path(__file__).resolve().parents[1] / "support" / "teardown_probe.py"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads listed by /proc"),
]


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_a_finished_stage_leaves_no_process_group_thread(zero_stage, tmp_path):
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(free_port()), str(PROBE), str(zero_stage),
        ],
        env=stage_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    reports = [json.loads((tmp_path / f"teardown_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert any("gloo" in n for n in r["during"]), r  # the group ran on gloo's threads
        assert r["after"] == [], r


@pytest.mark.parametrize("end", ["ok", "error", "kept-ok", "kept-error"])
def test_a_stage_process_exits_with_its_status_and_its_exit_handlers(end, tmp_path):
    """With a process group kept alive past the teardown (its threads still run when the exit
    handlers do), the process leaves without finalizing the interpreter, and still with the stage's
    status, its exit handlers run and its buffered output written; without one, it exits as
    usual, finalization included."""
    out = tmp_path / "at_exit.json"
    proc = subprocess.run(
        [sys.executable, str(PROBE.parent / "exit_probe.py"), end, str(out)],
        env=stage_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == (2 if "error" in end else 0), proc.stderr[-3000:]
    assert proc.stdout.endswith("trained")
    if "error" in end:
        assert 'error: data/train.jsonl line 7: field "chosen" is empty\n' in proc.stderr
    threads = json.loads(out.read_text())
    assert bool(threads) == ("kept" in end), threads
    assert ("interpreter finalized" in proc.stderr) == ("kept" not in end), proc.stderr[-2000:]
