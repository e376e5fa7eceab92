"""marlhf/runtime/startup.py: phases measured from the process's start, one line, logged once."""

from __future__ import annotations

import logging
import time
from pathlib import Path

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


def test_shared_memory_op_directory_is_torchs(tmp_path, monkeypatch):
    """Where the op is cached: the directory torch's extension builder itself uses."""
    from torch.utils.cpp_extension import _get_build_directory

    from marlhf.runtime.distributed import SHM_OP, shm_op_dir

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert shm_op_dir() == Path(_get_build_directory(SHM_OP, verbose=False))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert shm_op_dir() == Path(_get_build_directory(SHM_OP, verbose=False))


def _fake_ops(monkeypatch, installed: bool, compatible: bool):
    import deepspeed.git_version_info
    import deepspeed.ops

    from marlhf.runtime.distributed import SHM_OP

    monkeypatch.setitem(deepspeed.git_version_info.installed_ops, SHM_OP, installed)
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, SHM_OP, compatible)


def test_shared_memory_op_build_is_announced_until_it_is_cached(tmp_path, monkeypatch):
    from marlhf.runtime.distributed import SHM_OP, shm_op_notice

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    _fake_ops(monkeypatch, installed=False, compatible=True)
    notice = shm_op_notice()
    assert notice.startswith(
        "marlhf: building DeepSpeed's CPU communication op once (about 2-3 min"
    )
    assert str(tmp_path / "ext" / SHM_OP) in notice
    (tmp_path / "ext" / SHM_OP).mkdir(parents=True)
    (tmp_path / "ext" / SHM_OP / f"{SHM_OP}.so").write_bytes(b"")  # built by an earlier run
    assert shm_op_notice() is None
    (tmp_path / "ext" / SHM_OP / f"{SHM_OP}.so").unlink()
    _fake_ops(monkeypatch, installed=True, compatible=True)  # shipped prebuilt: no build
    assert shm_op_notice() is None
    _fake_ops(monkeypatch, installed=False, compatible=False)  # DeepSpeed does not build it here
    assert shm_op_notice() is None


def test_several_cpu_ranks_announce_the_build_on_the_first_local_rank(
    tmp_path, monkeypatch, capsys
):
    import deepspeed
    import torch

    from marlhf.runtime import distributed

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    _fake_ops(monkeypatch, installed=False, compatible=True)
    calls = []
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    for local_rank, says in (("0", True), ("1", False)):
        for k, v in {"RANK": local_rank, "WORLD_SIZE": "2", "LOCAL_RANK": local_rank}.items():
            monkeypatch.setenv(k, v)
        distributed.init_distributed()
        err = capsys.readouterr().err
        assert ("building DeepSpeed's CPU communication op once" in err) == says, local_rank
    assert len(calls) == 2
