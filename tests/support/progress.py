"""Run a long command and fail it only when it stops making progress, not when it is slow.

A fixed timeout on an end-to-end run fails a healthy one on a loaded machine (the demo test ran
past 1,500 s at load 4-9 while every stage was still training). :func:`run_while_progressing`
instead watches for progress: a new line on the command's stdout or stderr, or a change of size of
any file under ``watch`` (the stage logs: every stage logs each training step). When nothing of
that happens for ``stall_s`` seconds the command is taken for hung: its process group is killed
and the test fails with what it printed last. ``limit_s`` stays as a generous backstop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Finished:
    """What a guarded command left: its exit status and its whole output."""

    returncode: int
    stdout: str
    stderr: str


class Stalled(AssertionError):
    """The command made no progress for the allowed time (its process group was killed)."""


def _files_state(watch: Path | None) -> tuple:
    """``(path, size)`` of every file under ``watch`` (empty when it does not exist yet)."""
    if watch is None or not watch.exists():
        return ()
    state = []
    for root, _dirs, files in os.walk(watch):
        for name in files:
            path = os.path.join(root, name)
            try:
                state.append((path, os.path.getsize(path)))
            except OSError:  # removed between the listing and the stat
                continue
    return tuple(sorted(state))


def run_while_progressing(
    cmd: list[str],
    *,
    stall_s: float,
    watch: Path | None = None,
    limit_s: float = 6 * 3600,
    poll_s: float = 1.0,
    **popen_kwargs,
) -> Finished:
    """Run ``cmd`` (text mode, stdout and stderr captured) until it exits; raise :class:`Stalled`
    when neither a new output line nor a change under ``watch`` happened for ``stall_s`` seconds,
    or when it runs past ``limit_s`` in all. ``popen_kwargs`` go to ``subprocess.Popen``."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a hang is killed with its stages
        **popen_kwargs,
    )
    out: list[str] = []
    err: list[str] = []
    last = [time.monotonic()]

    def pump(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)
            last[0] = time.monotonic()

    readers = [
        threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err), daemon=True),
    ]
    for t in readers:
        t.start()
    start, files = time.monotonic(), _files_state(watch)
    reason = None
    while proc.poll() is None:
        time.sleep(poll_s)
        now, state = time.monotonic(), _files_state(watch)
        if state != files:
            files, last[0] = state, now
        if now - last[0] > stall_s:
            reason = f"no new output and no log growth for {now - last[0]:.0f} s"
        elif now - start > limit_s:
            reason = f"still running after {now - start:.0f} s"
        if reason:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
    for t in readers:
        t.join(timeout=10)
    if reason:
        tail = "".join(out)[-3000:] + "".join(err)[-3000:]
        raise Stalled(
            f"{' '.join(map(str, cmd[:4]))} ...: {reason}; killed. Its output ended:\n{tail}"
        )
    return Finished(proc.returncode, "".join(out), "".join(err))
