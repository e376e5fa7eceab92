"""``run_python``: :func:`subprocess.run` for the tests' ``python ...`` commands (a stage, a program
of the package), run as processes forked from one server per test run that has imported
torch, transformers, datasets and DeepSpeed (:mod:`marlhf.pipeline.launch`, as the demo starts its
stages). A tiny-model stage then starts in 2-3 s instead of 8-11; its output, exit status and
files are those of the same command run by ``python`` (``tests/pipeline/test_launch.py``).

Only what a test needs of :func:`subprocess.run` is taken: ``env``, ``cwd``, ``timeout``,
``check``, ``text``, and the output captured (``capture_output=True``, or ``stdout=PIPE`` with
``stderr=PIPE`` or ``STDOUT``). Anything else, or a command that is not ``sys.executable`` with
its arguments (a launcher such as ``torchrun`` or ``deepspeed``, another interpreter), or one
whose environment differs from the server's in a variable the libraries read as they load
(:data:`READ_ON_IMPORT`), runs through :func:`subprocess.run` itself. A test that signals or kills its process uses
:class:`subprocess.Popen` itself."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marlhf.pipeline.launch import Launcher

_launcher: Launcher | None = None
_server_env: dict[str, str] = {}
# variables the preloaded libraries read as they load (hub and cache locations, offline modes,
# DeepSpeed's accelerator): a command whose values differ from the server's runs on its own
READ_ON_IMPORT = ("HF_", "TRANSFORMERS_", "DS_", "TORCH", "PYTORCH_", "CUDA_", "DATASETS_")


def _read_on_import(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(READ_ON_IMPORT)}


def _forkable(cmd, kwargs: dict) -> bool:
    if not isinstance(cmd, list | tuple) or len(cmd) < 2 or cmd[0] != sys.executable:
        return False
    if cmd[1] in ("-m", "-c") and len(cmd) < 3:  # Python's own usage error, from Python
        return False
    if cmd[1] == "-m" and cmd[2] in ("torch.distributed.run", "deepspeed.launcher.runner"):
        return False
    if cmd[1].startswith("-") and cmd[1] not in ("-m", "-c"):  # interpreter options
        return False
    captured = kwargs.get("capture_output") or (
        kwargs.get("stdout") == subprocess.PIPE
        and kwargs.get("stderr") in (subprocess.PIPE, subprocess.STDOUT)
    )
    known = {"env", "cwd", "timeout", "check", "text", "capture_output", "stdout", "stderr"}
    return bool(captured) and set(kwargs) <= known


def run_python(cmd, **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` (same arguments and result), forked when it can be (module doc)."""
    if not _forkable(cmd, kwargs):
        return subprocess.run(cmd, **kwargs)
    global _launcher, _server_env
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    if _launcher is None:  # the libraries read the first command's environment as they load
        _launcher, _server_env = Launcher(env), env
    if _read_on_import(env) != _read_on_import(_server_env):
        return subprocess.run(cmd, **kwargs)
    cwd = Path(kwargs.get("cwd") or os.getcwd())
    merged = kwargs.get("stderr") == subprocess.STDOUT
    with tempfile.TemporaryDirectory(prefix="forked-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        proc = _launcher.start(list(cmd[1:]), env, cwd, out, None if merged else err)
        timeout = kwargs.get("timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        while proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                proc.send_signal(9)
                proc.wait()
                raise subprocess.TimeoutExpired(cmd, timeout)
            time.sleep(0.02)
        stdout = out.read_bytes() if out.exists() else b""
        stderr = None if merged else (err.read_bytes() if err.exists() else b"")
    if kwargs.get("text"):
        stdout = stdout.decode()
        stderr = None if stderr is None else stderr.decode()
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if kwargs.get("check"):
        done.check_returncode()
    return done
