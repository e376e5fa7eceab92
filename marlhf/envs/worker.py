"""Where the environments of a batch live, and how their calls (``init``, ``step``, ``finish``: get
the metrics, then close) run: in this process, or each in a process of its own.

- :class:`LocalPool` (``--env_timeout_s 0``): the environments are objects of this process; the
  calls of one round run one after the other (``--env_workers 1``) or in that many threads. A
  thread cannot be stopped, so there is no timeout: a hanging step hangs the run.
- :class:`ProcessPool` (``--env_timeout_s`` > 0): every row's environment lives in a process of its
  own for the whole episode (its state stays there between turns), started from a fork server that
  has skyrl-gym imported (a fresh interpreter, not a fork of the trainer and its threads). At most
  ``--env_workers`` calls run at once. A call that does not answer within the timeout has its
  process group killed (SIGKILL: a step stuck in C code or in a child process stops too), and the
  row gets a timeout error; the other rows' environments live on in their own processes. When the
  trainer dies (even by SIGKILL) the fork server exits, and each environment's process group with
  it (:func:`_die_with_the_trainer`).

Every call ends as an :class:`Outcome`: ``ok`` with the call's return value, ``error`` (the
environment raised; ``text`` is ``TypeName: message``) or ``timeout``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from marlhf.envs.loading import EnvFactory, factory_from_target

# Seconds a killed or finished environment process gets to be reaped.
JOIN_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """How one call ended: ``status`` ``ok`` (``value``: what it returned), ``error`` or
    ``timeout`` (``text``: what happened, one line)."""

    status: str
    value: Any = None
    text: str = ""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _finish(env) -> dict:
    """``get_metrics()`` then ``close()`` (always, even when the metrics fail): ``{"metrics",
    "metrics_error", "close_error"}``."""
    out: dict[str, Any] = {"metrics": {}, "metrics_error": None, "close_error": None}
    try:
        out["metrics"] = env.get_metrics() if hasattr(env, "get_metrics") else {}
    except Exception as err:  # noqa: BLE001 - reported as the row's error
        out["metrics_error"] = _one_line(err)
    try:
        env.close()
    except Exception as err:  # noqa: BLE001 - reported as the row's error
        out["close_error"] = _one_line(err)
    return out


def _finish_nothing() -> dict:
    return {"metrics": {}, "metrics_error": None, "close_error": None}


def run_call(factory: EnvFactory, env, kind: str, arg: Any, extras: dict):
    """One call on an environment of this process: (the environment, the call's value). ``init``
    builds the environment first."""
    if kind == "init":
        env = factory.make(extras)
        return env, env.init(arg)
    if kind == "step":
        return env, env.step(arg)
    if kind == "finish":  # an environment whose constructor failed has nothing to close
        return env, _finish(env) if env is not None else _finish_nothing()
    raise ValueError(f"unknown environment call {kind!r}")


class LocalPool:
    """The environments of a batch as objects of this process (see the module doc)."""

    def __init__(self, factory: EnvFactory, extras: list[dict], workers: int):
        self.factory, self.extras, self.workers = factory, extras, workers
        self.envs: list[Any] = [None] * len(extras)
        self._threads = (
            concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="marlhf-env")
            if workers > 1
            else None
        )

    def _one(self, i: int, kind: str, arg: Any) -> Outcome:
        try:
            self.envs[i], value = run_call(self.factory, self.envs[i], kind, arg, self.extras[i])
        except Exception as err:  # noqa: BLE001 - the environment's error, reported per row
            return Outcome("error", text=_one_line(err))
        return Outcome("ok", value)

    def call(self, rows: list[int], kind: str, args: list[Any]) -> list[Outcome]:
        """``kind`` on the environments of ``rows`` with ``args`` (one per row), in row order."""
        if self._threads is None:
            return [self._one(i, kind, a) for i, a in zip(rows, args, strict=True)]
        return list(self._threads.map(self._one, rows, [kind] * len(rows), args))

    def alive(self, i: int) -> bool:
        return self.envs[i] is not None

    def drop(self, i: int) -> None:
        self.envs[i] = None

    def shutdown(self) -> None:
        """Close every environment still open (errors ignored: the run is ending)."""
        for i, env in enumerate(self.envs):
            if env is not None:
                _finish(env)
                self.envs[i] = None
        if self._threads is not None:
            self._threads.shutdown(wait=True)


def _kill_own_group(*_) -> None:
    os.killpg(0, signal.SIGKILL)


def _die_with_the_trainer() -> None:
    """End this process's group (the environment and any process its steps started) when the
    trainer dies. The fork server exits once no process holds its "alive" pipe, so this process
    lets go of the copy it inherited; the server's exit then signals this process
    (``PR_SET_PDEATHSIG``), and a watchdog thread that sees the parent change does the same in case
    the signal's handler cannot run."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    parent = os.getppid()
    signal.signal(signal.SIGTERM, _kill_own_group)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        _kill_own_group()

    threading.Thread(target=watch, daemon=True, name="marlhf-env-watchdog").start()
    if os.getppid() != parent:  # the server ended before the signal was armed
        _kill_own_group()


def _child(conn, spec: str, name: str, target: str, kwargs: dict, env_config: dict, extras: dict):
    """The loop of an environment's process: answer each request ``(kind, arg)`` with ``("ok",
    value)`` or ``("error", text)`` until ``finish`` (or the trainer closes the pipe)."""
    os.setsid()  # its own process group: a timeout kills the environment's children too
    _die_with_the_trainer()
    env, factory = None, None
    while True:
        try:
            kind, arg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if factory is None:
                factory = factory_from_target(spec, name, target, kwargs, env_config)
            env, value = run_call(factory, env, kind, arg, extras)
            reply = ("ok", value)
        except Exception as err:  # noqa: BLE001 - the environment's error, reported per row
            reply = ("error", _one_line(err))
        try:
            conn.send(reply)
        except Exception as err:  # noqa: BLE001 - e.g. metadata that cannot be pickled
            conn.send(("error", f"its answer cannot be sent to the trainer: {_one_line(err)}"))
        if kind == "finish":
            return


def _context(factory: EnvFactory):
    """The fork-server context. The server (started once per trainer process, a fresh interpreter)
    imports skyrl-gym, OmegaConf and the environment's module (when it is a module) before it forks
    any environment process, so these start without importing them again; the trainer's main module
    is not imported there."""
    ctx = multiprocessing.get_context("forkserver")
    preload = ["skyrl_gym", "omegaconf", "marlhf.envs.worker"]
    module = factory.target.rpartition(":")[0]
    if module and not module.endswith(".py"):
        preload.append(module)
    ctx.set_forkserver_preload(preload)
    return ctx


def check_importable(factory: EnvFactory) -> None:
    """ValueError when a worker process could not import the environment's class (a class defined
    in ``__main__`` or inside a function and registered in-process)."""
    module, _, qualname = factory.target.rpartition(":")
    if module == "__main__" or "<locals>" in qualname:
        raise ValueError(
            f"--env {factory.spec}: its class {factory.target} cannot be imported by the worker "
            "processes of --env_timeout_s; define it in a module or a file (--env "
            "path/to/file.py:ClassName), or run without a timeout (--env_timeout_s 0)"
        )


class ProcessPool:
    """Every row's environment in a process of its own (see the module doc)."""

    def __init__(self, factory: EnvFactory, extras: list[dict], workers: int, timeout_s: float):
        check_importable(factory)
        self.factory, self.extras, self.workers, self.timeout_s = (
            factory,
            extras,
            workers,
            timeout_s,
        )
        self._ctx = _context(factory)
        self.procs: list[Any] = [None] * len(extras)
        self.conns: list[Any] = [None] * len(extras)

    def _start(self, i: int) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        f = self.factory
        proc = self._ctx.Process(
            target=_child,
            args=(child, f.spec, f.name, f.target, f.kwargs, f.env_config, self.extras[i]),
            name=f"marlhf-env-{i}",
        )
        proc.start()
        child.close()
        self.procs[i], self.conns[i] = proc, parent

    def alive(self, i: int) -> bool:
        return self.procs[i] is not None

    def _kill(self, i: int) -> None:
        proc, conn = self.procs[i], self.conns[i]
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.join(JOIN_S)
        conn.close()
        self.procs[i] = self.conns[i] = None

    def drop(self, i: int) -> None:
        """Forget row ``i``'s process (after its ``finish``, or to stop it)."""
        proc = self.procs[i]
        if proc is not None:
            proc.join(JOIN_S)
            if proc.is_alive():
                self._kill(i)
                return
            self.conns[i].close()
            self.procs[i] = self.conns[i] = None

    def call(self, rows: list[int], kind: str, args: list[Any]) -> list[Outcome]:
        """``kind`` on the environments of ``rows`` with ``args``, at most ``workers`` at once, each
        within ``timeout_s`` (its process killed otherwise); outcomes in row order."""
        out: dict[int, Outcome] = {}
        queue = list(zip(rows, args, strict=True))
        running: dict[Any, tuple[int, float]] = {}  # connection -> (row, deadline)
        while queue or running:
            while queue and len(running) < self.workers:
                i, arg = queue.pop(0)
                if kind == "init" and self.procs[i] is None:
                    self._start(i)
                if self.procs[i] is None:
                    out[i] = Outcome("error", text="its process is gone")
                    continue
                try:
                    self.conns[i].send((kind, arg))
                except (OSError, ValueError) as err:
                    out[i] = Outcome("error", text=f"its process is gone ({_one_line(err)})")
                    self._kill(i)
                    continue
                running[self.conns[i]] = (i, time.monotonic() + self.timeout_s)
            if not running:
                continue
            wait = max(0.0, min(d for _, d in running.values()) - time.monotonic())
            for conn in multiprocessing.connection.wait(list(running), timeout=wait):
                i, _ = running.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    code = self.procs[i].exitcode if self.procs[i] is not None else None
                    self._kill(i)
                    out[i] = Outcome("error", text=f"its process ended (exit code {code})")
                    continue
                out[i] = Outcome("ok", value) if status == "ok" else Outcome("error", text=value)
            now = time.monotonic()
            for conn, (i, deadline) in list(running.items()):
                if deadline <= now:
                    del running[conn]
                    self._kill(i)
                    out[i] = Outcome("timeout", text=f"no answer within {self.timeout_s:g} s")
        return [out[i] for i in rows]

    def shutdown(self) -> None:
        """Ask every live environment to close (within the timeout), then kill what is left."""
        live = [i for i in range(len(self.procs)) if self.procs[i] is not None]
        if live:
            self.call(live, "finish", [None] * len(live))
        for i in range(len(self.procs)):
            if self.procs[i] is not None:
                self.drop(i)
