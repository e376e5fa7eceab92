"""Run a program (``-m MODULE`` or a script path) in this process and write its peak memory to a
JSON file when it exits: ``python -m marlhf.gpu_check.runner PEAK.json -m marlhf.stages.sft ARGS``.

Written at exit (also after ``sys.exit``): ``peak_rss_mb`` (the process's peak resident memory)
and, on CUDA, ``peak_cuda_allocated_mb`` and ``peak_cuda_reserved_mb`` (torch's allocator)."""

from __future__ import annotations

import atexit
import json
import resource
import runpy
import sys

import torch


def _write_peak(path: str) -> None:
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["peak_cuda_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
            out["peak_cuda_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
    except Exception as e:  # the measurement must never hide the program's own exit status
        out["error"] = repr(e)
    with open(path, "w") as f:
        json.dump(out, f)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(
            "usage: python -m marlhf.gpu_check.runner PEAK.json (-m MODULE | SCRIPT) ARGS"
        )
    peak = sys.argv[1]
    atexit.register(_write_peak, peak)
    if sys.argv[2] == "-m":
        module, args = sys.argv[3], sys.argv[4:]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = sys.argv[2], sys.argv[3:]
        sys.argv = [script, *args]
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
