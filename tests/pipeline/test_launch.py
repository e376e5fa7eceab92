"""The demo's stage launcher (marlhf.pipeline.launch): a process forked from a server that has
imported torch runs a command line as ``python`` would (status, output, environment, working
directory, exit handlers, signals) and computes what a separate ``python`` process computes, to
the bit, at 1 and 2 threads."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marlhf.pipeline.launch import Launcher, LauncherError
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]

# a few steps of training a small network, then a sum whose rounding depends on how many threads
# split it: the thread count torch uses, the digest of the weights and the sum
_TRAIN = """
import hashlib, torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
x = torch.randn(64, 256)
for _ in range(5):
    loss = (net(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters()))
print(torch.get_num_threads(), digest.hexdigest(), torch.randn(4_000_000).sum().item())
"""


def _env(**extra) -> dict:
    env = {**stage_env(), **extra}
    env.pop("MKL_NUM_THREADS", None)  # tests/conftest.py sets it; the demo's stages have none
    return env


@pytest.fixture(scope="module")
def launcher():
    return Launcher(_env(), preload=["torch"])


def _run(launcher, args, tmp_path, threads="1", name="stage.log", timeout=120, **env):
    log = tmp_path / name
    proc = launcher.start(args, _env(OMP_NUM_THREADS=threads, **env), tmp_path, log)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode is not None, "the stage did not end"
    return proc, log.read_text()


def test_a_forked_stage_computes_what_a_separate_python_process_computes(launcher, tmp_path):
    seen = {}
    for threads in ("1", "2"):
        proc, out = _run(launcher, ["-c", _TRAIN], tmp_path, threads=threads, name=f"{threads}.log")
        alone = subprocess.run(
            [sys.executable, "-c", _TRAIN],
            env=_env(OMP_NUM_THREADS=threads),
            capture_output=True,
            text=True,
            check=True,
        )
        assert proc.returncode == 0, out
        assert out.split()[0] == threads
        assert out == alone.stdout  # thread count, the weights' digest, the sum
        assert proc.cpu_s > 0
        seen[threads] = out.split()[2]
    assert seen["1"] != seen["2"]  # the sum does depend on the thread count: it took effect


def test_module_script_and_code_get_their_arguments_directory_and_environment(launcher, tmp_path):
    where = tmp_path / "work"
    where.mkdir()
    (where / "probe.py").write_text(
        "import os, sys\nprint(sys.argv, os.getcwd() == os.environ['HERE'], sys.stdin.read() == '')\n"
    )
    seen = []
    for args in (["-m", "probe", "a", "b"], [str(where / "probe.py"), "a"], ["-c", "print(1)"]):
        log = tmp_path / f"{len(seen)}.log"
        proc = launcher.start(args, {**stage_env(), "HERE": str(where)}, where, log)
        assert proc.wait() == 0
        seen.append(log.read_text())
    assert seen[0] == f"[{str(where / 'probe.py')!r}, 'a', 'b'] True True\n"
    assert seen[1] == f"[{str(where / 'probe.py')!r}, 'a'] True True\n"
    assert seen[2] == "1\n"


@pytest.mark.parametrize(
    "code, status, said",
    [
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('error: no such file')", 1, "error: no such file\n"),
        ("raise ValueError('broken')", 1, "ValueError: broken\n"),
        ("import os; os._exit(7)", 7, ""),
    ],
)
def test_the_stage_s_exit_status_and_last_words_are_python_s(
    launcher, tmp_path, code, status, said
):
    proc, out = _run(launcher, ["-c", code], tmp_path)
    assert proc.returncode == status
    assert out.endswith(said)
    if "raise" in code:
        assert out.startswith("Traceback (most recent call last):")


def test_exit_handlers_run_and_the_output_is_flushed(launcher, tmp_path):
    marker = tmp_path / "released"
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('lock released'))\n"
        "sys.stdout.write('no newline')\n"
    )
    proc, out = _run(launcher, ["-c", code], tmp_path)
    assert proc.returncode == 0 and out == "no newline"
    assert marker.read_text() == "lock released"


def test_a_signal_reaches_the_stage_and_its_handler_decides_the_status(launcher, tmp_path):
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))\n"
        "print('training', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "stage.log"
    proc = launcher.start(["-c", code], stage_env(), tmp_path, log)
    deadline = time.monotonic() + 60
    while "training" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait() == 143
    # without a handler: killed by it, as subprocess reports it; Ctrl-C is Python's again
    proc = launcher.start(["-c", "import time; time.sleep(60)"], stage_env(), tmp_path, log)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM
    proc, out = _run(
        launcher, ["-c", "import os, signal; os.kill(os.getpid(), signal.SIGINT)"], tmp_path
    )
    assert proc.returncode == 130 and "KeyboardInterrupt" in out


def test_a_server_that_cannot_import_its_libraries_is_named(tmp_path):
    broken = Launcher(stage_env(), preload=["no_such_module_here"])
    with pytest.raises(LauncherError) as error:
        broken.start(["-c", "print(1)"], stage_env(), tmp_path, tmp_path / "stage.log")
    assert str(error.value).startswith(
        "the process that starts the stages (python -m marlhf.pipeline.launch) ended with status 1"
    )
    assert not (tmp_path / "stage.log").exists()


@pytest.mark.parametrize("flag", ["-m", "-c"])
def test_a_flag_without_its_argument_gets_python_s_own_usage_error(flag):
    from tests.support.forked import run_python

    cmd = [sys.executable, flag]
    want = subprocess.run(cmd, capture_output=True, text=True)
    got = run_python(cmd, capture_output=True, text=True)
    assert (got.returncode, got.stderr) == (want.returncode, want.stderr) != (0, "")
