"""How a stage process ends when it does not finish: one ``error:`` line instead of a traceback, an
exit status, and the process group torn down on every path.

An error *raised on purpose* is one of the package's own error classes (``DataError``,
``NonFiniteError``, ``OutputDirInUse``, ...) or one raised by a ``raise`` statement in its code:
those name the flag, file, model or directory and what to do (a bad flag value, a model of the
wrong kind, a tokenizer mismatch, a missing spaCy model, no checkpoint to resume from, a full
disk, a non-finite loss...), so their traceback adds pages, not information. Anything else (an
error inside torch, DeepSpeed or transformers, an ``assert``) is a bug or an environment problem
and keeps its traceback. ``MARLHF_TRACEBACK=1`` shows the traceback of every error.

Exit status: 2 for bad input (``ValueError``, ``FileNotFoundError``, ``NotADirectoryError``: the
flags, data or models given), 1 for the other errors raised on purpose (the run failed), the
error's own status for ``SystemExit``.

Ranks. Every rank sees the same flags, data and models, so an input error is raised by every rank
alike: rank 0 prints it, and so does the first rank of each other node (``LOCAL_RANK`` 0), where a
path may be missing that rank 0's node has. Any other error is printed by the rank it happened on,
with its rank when there are several.

The process group is destroyed before the process exits, on every path: a gloo group left alive
until interpreter exit can abort the process ("terminate called without an active exception",
status 134) after the error was printed or the model saved. :func:`run_program`, a stage's
process entry, leaves without finalizing the interpreter where a library still keeps a group.
"""

from __future__ import annotations

import atexit
import contextlib
import linecache
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from marlhf.runtime.distributed import process_group_threads, shutdown_distributed

PACKAGE_DIR = Path(__file__).resolve().parents[1]
INPUT_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


def _innermost_frame(exc: BaseException):
    tb = exc.__traceback__
    if tb is None:
        return None, 0
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame, tb.tb_lineno


def raised_on_purpose(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the package's own error classes (a bad data row, a non-finite
    loss, an output directory in use, ...) or came from a ``raise`` statement in the package
    (not from a library, an ``assert`` or a failing builtin call)."""
    if type(exc).__module__.split(".")[0] == "marlhf":
        return True
    frame, line = _innermost_frame(exc)
    if frame is None or isinstance(exc, AssertionError):
        return False
    filename = frame.f_code.co_filename
    try:
        Path(filename).resolve().relative_to(PACKAGE_DIR)
    except ValueError:
        return False
    return linecache.getline(filename, line).lstrip().startswith("raise")


def exit_status(exc: BaseException) -> int:
    """2 for bad input (the flags, data or models given), 1 for any other failure."""
    return 2 if isinstance(exc, INPUT_ERRORS) else 1


def _rank_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) from the launcher's environment (no collective)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        r, ws = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        r, ws = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    return r, int(os.environ.get("LOCAL_RANK", str(r)) or r), ws


def error_line(exc: BaseException) -> str | None:
    """The one line this rank prints for ``exc`` (None: another rank reports it)."""
    rank, local_rank, world = _rank_env()
    text = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    if isinstance(exc, INPUT_ERRORS):
        if rank == 0 or local_rank == 0:
            return f"error: {text}"
        return None
    prefix = f"rank {rank}: " if world > 1 else ""
    return f"error: {prefix}{text}"


def tear_down_process_group() -> None:
    """Destroy the process group without waiting for the other ranks (they may be anywhere), and
    release what keeps its threads alive (:func:`marlhf.runtime.distributed.shutdown_distributed`)."""
    try:
        shutdown_distributed(wait=False)
    except Exception:  # noqa: BLE001 - leaving anyway; the error being reported matters
        pass


def report_and_exit(exc: BaseException, status: int | None = None) -> None:
    """Print ``exc`` as one line (when this rank reports it), tear the process group down and
    raise ``SystemExit`` with ``status`` (default :func:`exit_status`)."""
    line = error_line(exc)
    if line is not None:  # one write: the lines of several ranks on one stream do not interleave
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    for handler in logging.getLogger().handlers:
        handler.flush()
    tear_down_process_group()
    raise SystemExit(exit_status(exc) if status is None else status) from None


def run_program(main: Callable[[], None]) -> None:
    """A stage's process (``python -m marlhf.stages...``): ``main()``, then the process's exit.

    The stage has torn its process groups down (:func:`marlhf.runtime.distributed.shutdown_distributed`).
    Where a library still keeps one alive (DeepSpeed's ZeRO-3 engines outlive ``destroy()``),
    its threads would meet the interpreter's finalization, which can abort the rank after its
    work is saved; then the exit handlers run, the output is flushed and the process leaves with
    its status without finalizing. Otherwise it exits as usual. An uncaught exception (a bug) is
    left to the interpreter, with its traceback."""
    try:
        main()
        status: object = 0
    except SystemExit as e:
        status = e.code
    if not process_group_threads():
        raise SystemExit(status)
    if status is None:
        status = 0
    elif not isinstance(status, int):  # as SystemExit("message") does: the message, status 1
        print(status, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
