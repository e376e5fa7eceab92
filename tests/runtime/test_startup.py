"""marlhf/runtime/startup.py: phases measured from the process's start, one line, logged once."""

from __future__ import annotations

import logging
import time

from marlhf.runtime.distributed import free_port
from marlhf.runtime.startup import StartupClock, cpu_seconds, process_start, report


def test_process_start_is_before_now_and_after_boot():
    start = process_start()
    assert start <= time.time() and time.time() - start < 24 * 3600


def test_phases_add_up_and_the_line_names_them():
    clock = StartupClock()
    t0 = cpu_seconds()
    while cpu_seconds() - t0 < 0.05:  # burn CPU in the second phase
        pass
    clock.mark("imports")
    clock.mark("data")
    names = [n for n, _, _ in clock.phases]
    assert names == ["imports", "data"]
    assert all(w >= 0 and c >= 0 for _, w, c in clock.phases)
    assert clock.phases[0][2] >= 0.05  # the CPU spent before the first mark
    line = clock.line()
    assert line.startswith("start-up ") and "imports " in line and line.endswith("(wall/CPU s)")


def test_report_logs_once(caplog, monkeypatch):
    import marlhf.runtime.startup as startup

    clock = StartupClock()
    clock.mark("imports")
    monkeypatch.setattr(startup, "CLOCK", clock)
    log = logging.getLogger("test.startup")
    with caplog.at_level(logging.INFO, logger="test.startup"):
        report(log)
        report(log)
        startup.mark("later")  # after the report: not a start-up phase
    assert sum("start-up" in r.getMessage() for r in caplog.records) == 1
    assert [n for n, _, _ in clock.phases] == ["imports"]


def test_one_cpu_process_starts_without_the_shared_memory_op():
    """A world of one initialises DeepSpeed without loading its shm all-reduce op (nothing to
    reduce; loading it probes every op and waits on the machine-wide extension lock)."""
    import subprocess
    import sys

    from tests.support.stage_env import stage_env

    code = (
        "import sys, torch\n"
        "from marlhf.runtime.distributed import init_distributed, world_size\n"
        "init_distributed()\n"
        "ds = sys.modules['deepspeed.comm.torch']\n"
        "print('world', world_size(), torch.distributed.is_initialized(),\n"
        "      ds.build_shm_op.__name__)\n"
        "torch.distributed.all_reduce(torch.ones(1))\n"
        "torch.distributed.destroy_process_group()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=stage_env(), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "world 1 True build_shm_op" in proc.stdout  # DeepSpeed's own function is back
    assert "shm_comm_op built" not in proc.stdout + proc.stderr


def test_two_cpu_ranks_start_without_the_shared_memory_op(tmp_path):
    """Two ranks under torchrun, on an empty extension cache: neither builds nor loads the op
    (DeepSpeed uses it for tensor-parallel inference only), and their collectives work."""
    import subprocess
    import sys

    from tests.support.stage_env import stage_env

    code = (
        "import sys, torch\n"
        "from marlhf.runtime.distributed import init_distributed, world_size\n"
        "init_distributed()\n"
        "rank = torch.distributed.get_rank()\n"
        "x = torch.ones(1) * (rank + 1)\n"
        "torch.distributed.all_reduce(x)\n"
        "built = sys.modules['deepspeed.comm.torch'].build_shm_op.__name__\n"
        "open(sys.argv[1] + f'/rank{rank}.txt', 'w').write(f'world {world_size()} {float(x)} {built}')\n"
        "torch.distributed.destroy_process_group()\n"
    )
    script = tmp_path / "two.py"
    script.write_text(code)
    env = {**stage_env(), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(script), str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):  # each rank's own file: two ranks printing to one pipe interleave
        assert (tmp_path / f"rank{rank}.txt").read_text() == "world 2 3.0 build_shm_op"
    assert not (tmp_path / "ext").exists()  # nothing built, nothing looked up
    assert "shm_comm" not in proc.stdout + proc.stderr  # DeepSpeed prints the op's build or load
