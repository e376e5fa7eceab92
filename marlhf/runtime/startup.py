"""Where a program's start-up goes: wall and CPU seconds of each phase, from the process's start.

A stage marks the end of each phase (``mark("data")``); the first mark's phase, ``imports``, runs
from the process's start (the interpreter, then the imports of torch, transformers, datasets, ...).
After its first training step the stage logs one line::

    start-up 6.1 s wall, 4.9 s CPU: imports 2.9/2.6, distributed 0.1/0.1, data 0.4/0.4, model 0.6/0.5,
    engine 1.3/0.8, first step 0.8/0.5 (wall/CPU s)

CPU seconds are the process's own (user + system, all threads): on a loaded machine they stay close
to what the phase costs on an idle one while wall seconds grow. ``benchmarks/bench_startup.py``
collects these lines from the tiny-model runs.
"""

from __future__ import annotations

import os
import resource
import time

_IMPORTED = time.time()


def process_start() -> float:
    """The process's start (epoch seconds) from ``/proc``; where that is unavailable, the time this
    module was imported."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime, field 22 of proc(5), in clock ticks since boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class StartupClock:
    """Phases as (name, wall seconds, CPU seconds), each from the end of the previous one."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, float, float]] = []
        self._wall = process_start()
        self._cpu = 0.0
        self.reported = False

    def mark(self, name: str) -> None:
        """End the current phase as ``name``."""
        wall, cpu = time.time(), cpu_seconds()
        self.phases.append((name, max(wall - self._wall, 0.0), cpu - self._cpu))
        self._wall, self._cpu = wall, cpu

    def line(self) -> str:
        """``start-up W s wall, C s CPU: phase w/c, ... (wall/CPU s)``."""
        wall = sum(w for _, w, _ in self.phases)
        cpu = sum(c for _, _, c in self.phases)
        parts = ", ".join(f"{n} {w:.1f}/{c:.1f}" for n, w, c in self.phases)
        return f"start-up {wall:.1f} s wall, {cpu:.1f} s CPU: {parts} (wall/CPU s)"


CLOCK = StartupClock()


def mark(name: str) -> None:
    """End the current start-up phase of this process as ``name``."""
    if not CLOCK.reported:
        CLOCK.mark(name)


def first_step(logger) -> None:
    """End the start-up with the first training step and log the line (once per process)."""
    mark("first step")
    report(logger)


def report(logger) -> None:
    """Log the start-up line once (the first call; later calls do nothing)."""
    if not CLOCK.reported and CLOCK.phases:
        logger.info(CLOCK.line())
        CLOCK.reported = True
