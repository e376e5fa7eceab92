"""CPU time and peak memory of a phase of the PPO step (``--log_phase_resources``).

Per phase (generate, score, macro, train): the process's CPU seconds (``time.process_time``: on a
shared machine a steadier cost than wall time, which counts the time other processes held the
cores), the peak resident set size and, on CUDA, the peak allocated memory. The peak RSS of a phase
is measured by resetting the kernel's high-water mark before it (Linux: writing ``5`` to
``/proc/self/clear_refs``) and reading ``VmHWM`` after it; where the mark cannot be reset (another
OS) the figure is the peak since the process started (``ru_maxrss``), an upper bound.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the process's peak-RSS mark to its current RSS; False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The peak resident set size in MiB since the last :func:`reset_peak_rss` (or the start)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


class PhaseResources:
    """``start()`` before a phase, ``stop(name)`` after it: adds ``time_cpu/<name>`` (summed over
    the phase's calls in a step), ``mem/peak_rss_mb/<name>`` and, on CUDA,
    ``mem/peak_cuda_mb/<name>`` (maxima over its calls) to :attr:`metrics`."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self._cpu0 = 0.0

    def start(self) -> None:
        reset_peak_rss()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self._cpu0 = time.process_time()

    def stop(self, name: str) -> None:
        m = self.metrics
        m[f"time_cpu/{name}"] = m.get(f"time_cpu/{name}", 0.0) + time.process_time() - self._cpu0
        key = f"mem/peak_rss_mb/{name}"
        m[key] = max(m.get(key, 0.0), peak_rss_mb())
        if torch.cuda.is_available():
            key = f"mem/peak_cuda_mb/{name}"
            m[key] = max(m.get(key, 0.0), torch.cuda.max_memory_allocated() / 2**20)
