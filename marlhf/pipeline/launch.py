"""Stage processes that start without importing torch, transformers, datasets and DeepSpeed again.

A tiny-model stage spent 8-11 of its start-up seconds before its first step, most of them importing
these libraries (the ``start-up`` line, :mod:`marlhf.runtime.startup`: imports 3.4 s, DeepSpeed's
import 1 s, the Gemma model classes of transformers 2 s), and the demo starts eleven stages, seven
of them one after the other. :class:`Launcher` starts one server process
(``python -m marlhf.pipeline.launch``) that imports them once, then forks a process for each stage
it is asked for. The fork runs the stage's command line as ``python`` would (``-m module``,
``-c code`` or a script, with its arguments in ``sys.argv``), with the stage's environment, working
directory, thread count and log file, and exits with the stage's status. The server never imports
the pipeline's modules or the project beyond this one, so every stage imports the project afresh.

What a stage still sees differently from a separate ``python`` command:

- environment variables that a preloaded library reads on import take the server's value: the
  server starts with the pipeline's environment plus the stages' fixed settings (offline hub and
  data sets, DeepSpeed's CPU accelerator) and ``OMP_NUM_THREADS`` set to 1; a stage's thread
  count is applied with ``torch.set_num_threads`` (which sets OpenMP's and MKL's);
- standard input is ``/dev/null``; standard output and error are line-buffered.

Ctrl-C reaches the stages (the server is in the pipeline's process group and ignores it). The
server ends once the pipeline's process has ended (its standard input closes) and every stage it
forked has ended. The handle :meth:`Launcher.start` returns answers like
:class:`subprocess.Popen` (``pid``, ``poll``, ``wait``, ``send_signal``, ``returncode``), plus
``cpu_s``, the stage's CPU seconds (user + system, its children included) from ``wait4``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

# what the stage programs import before their first line of work (python -X importtime)
PRELOAD = [
    "torch",
    "datasets",
    "deepspeed",
    "transformers",
    "transformers.models.gemma.modeling_gemma",
]


class LauncherError(RuntimeError):
    """The server that forks the stages could not start or ended early."""


# --- the server and the stage processes it forks --------------------------------------------------


def _stream(fd: int) -> io.TextIOWrapper:
    raw = open(fd, "wb", closefd=False)  # noqa: SIM115 - the process's own descriptor, kept open
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _run_command(args: list[str]) -> None:
    """Run ``python ARGS`` in this process: ``-m module``, ``-c code`` or ``script.py``."""
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path.insert(0, "")
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(args)
        sys.path.insert(0, str(Path(args[0]).resolve().parent))
        runpy.run_path(args[0], run_name="__main__")


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # as SystemExit("message") does
    return 1


def _stage(request: dict) -> None:
    """The forked stage process: the stage's environment, log and threads, its command, its exit
    (the exit handlers run, as at a process's end; then ``os._exit``: nothing of the server's
    loop runs in the fork)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(
            signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        )
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["log"]), (2, request.get("err") or request["log"])):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0)  # noqa: SIM115 - the process's standard input for its whole life
    sys.stdout, sys.stderr = _stream(1), _stream(2)
    if "torch" in sys.modules:  # preloaded: OpenMP read the server's thread count as it loaded
        sys.modules["torch"].set_num_threads(int(request["env"].get("OMP_NUM_THREADS", "1")))
    try:
        _run_command(request["args"])
        status = 0
    except SystemExit as e:
        status = _exit_status(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback, status 1
        traceback.print_exc()
        status = 1
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # the stage's own (its run lock's release) and the libraries'
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def serve(preload: list[str]) -> None:
    """The server's loop, after importing ``preload``: one JSON request a line on standard input
    (``args``, ``env``, ``cwd``, ``log``, ``err``, ``id``), answered on standard output with ``{"id",
    "pid"}`` once forked and ``{"ended": id, "status", "cpu_s"}`` once ended (by request id: a
    pid may be reused by a later stage)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the stages; the server waits
    for name in preload:
        importlib.import_module(name)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # a library's print cannot garble the answers
    os.close(null)

    def answer(message: dict) -> None:
        with contextlib.suppress(BrokenPipeError):  # the pipeline has gone: the stages go on
            answers.write(json.dumps(message) + "\n")

    pending, children, open_ = b"", {}, True  # children: pid -> request id
    while open_ or children:
        if open_ and select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 1 << 16)
            open_ = bool(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    answers.close()
                    _stage(request)
                children[pid] = request["id"]
                answer({"id": request["id"], "pid": pid})
        elif not open_:
            select.select([], [], [], 0.05)
        while children:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            ident = children.pop(pid)
            cpu = usage.ru_utime + usage.ru_stime
            answer({"ended": ident, "status": os.waitstatus_to_exitcode(status), "cpu_s": cpu})


# --- the pipeline's side ---------------------------------------------------------------------------


class Started:
    """A running stage (the :class:`subprocess.Popen` calls the pipeline uses)."""

    def __init__(self, launcher: Launcher, ident: int, pid: int) -> None:
        self._launcher, self._ident, self.pid = launcher, ident, pid
        self.returncode: int | None = None
        self.cpu_s = 0.0

    def poll(self) -> int | None:
        if self.returncode is None:
            ended = self._launcher._ended.get(self._ident)
            if ended is not None:
                self.returncode, self.cpu_s = ended
            elif self._launcher._gone:  # the server was killed: its stages' ends are unknown
                self.returncode = 1
        return self.returncode

    def wait(self) -> int:
        with self._launcher._changed:
            self._launcher._changed.wait_for(lambda: self.poll() is not None)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class Launcher:
    """Starts stage processes forked from one server that has imported ``preload``.

    ``env``: the environment the server starts with (the stages' settings that libraries read on
    import); the server starts at the first :meth:`start`. A server that cannot start (a module
    of ``preload`` fails to import: its traceback goes to this process's standard error) makes
    :meth:`start` raise :class:`LauncherError`."""

    def __init__(self, env: dict[str, str], preload: list[str] = PRELOAD) -> None:
        self._env = {**env, "OMP_NUM_THREADS": "1"}
        self._preload = list(preload)
        self._server: subprocess.Popen | None = None
        self._changed = threading.Condition()
        self._forked: dict[int, int] = {}  # request id -> pid
        self._ended: dict[int, tuple[int, float]] = {}  # request id -> (status, CPU seconds)
        self._gone = False  # the server has ended
        self._next = 0

    def _read(self, server: subprocess.Popen) -> None:
        for line in server.stdout:
            message = json.loads(line)
            with self._changed:
                if "id" in message:
                    self._forked[message["id"]] = message["pid"]
                elif "ended" in message:
                    self._ended[message["ended"]] = (message["status"], message["cpu_s"])
                self._changed.notify_all()
        server.wait()
        with self._changed:
            self._gone = True
            self._changed.notify_all()

    def _started(self) -> subprocess.Popen:
        if self._server is None:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "marlhf.pipeline.launch", *self._preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self._env,
                cwd=Path(__file__).resolve().parents[2],
                text=True,
            )
            threading.Thread(target=self._read, args=(self._server,), daemon=True).start()
        return self._server

    def start(
        self, args: list[str], env: dict[str, str], cwd: Path, log: Path, err: Path | None = None
    ) -> Started:
        """Start ``python ARGS`` with ``env`` in ``cwd``, its output appended to ``log`` (its
        standard error to ``err`` when given)."""
        server = self._started()
        with self._changed:
            ident, self._next = self._next, self._next + 1
            request = {"id": ident, "args": list(args), "env": dict(env)}
            request.update(cwd=str(cwd), log=str(log), err=None if err is None else str(err))
            try:
                server.stdin.write(json.dumps(request) + "\n")
                server.stdin.flush()
            except BrokenPipeError:
                pass  # the server has ended: said below
            self._changed.wait_for(lambda: ident in self._forked or server.poll() is not None)
            if ident not in self._forked:
                raise LauncherError(
                    f"the process that starts the stages (python -m marlhf.pipeline.launch) "
                    f"ended with status {server.returncode} before it started {args[:2]}"
                )
            return Started(self, ident, self._forked[ident])


if __name__ == "__main__":
    serve(sys.argv[1:])
