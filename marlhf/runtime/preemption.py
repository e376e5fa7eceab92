"""Stopping a run on SIGTERM or SIGINT (Ctrl-C) with a resumable checkpoint.

Clusters send SIGTERM some time before they preempt or cancel a job (SLURM's ``KillWait``, 30 s
by default; Kubernetes' grace period). A stage takes the signal as a request: the step under way
is finished, every rank saves the resumable training state of that step, rank 0 prints one line
naming the step and the checkpoint, and the process exits with status 128 + the signal's number
(143 for SIGTERM, 130 for SIGINT). The same command resumes from that checkpoint.

- Before training starts (loading models and data) there is nothing to save: the first signal
  stops the process at once, with one line.
- A second signal stops at once, without a checkpoint (the previous ones are kept; a save it
  interrupts is skipped by the next resume). A repeat of the signal less than
  ``REPEAT_WINDOW_S`` after the first is the same request: ``torchrun`` and the ``deepspeed``
  launcher pass the signal they get on to every rank, which a terminal's Ctrl-C or a scheduler
  has already signalled.
- The ranks agree on when to stop (:func:`stop_requested`, a collective at the end of every
  step): a signal that reaches some ranks only stops all of them after the same step.

Python runs a signal handler between bytecodes of the main thread, so a request is noticed after
the operation under way returns (a forward pass, a collective).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

from marlhf.runtime.distributed import device

SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_WINDOW_S = 2.0


class StoppedBySignal(BaseException):
    """A run stopped on request (after saving a resumable checkpoint, once training began);
    ``str()`` is the line to print, ``status`` the exit status (128 + the signal's number). A
    ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.status = 128 + signum


class _Requests:
    signum = 0  # the first signal received (0: none)
    received_at = 0.0
    training = False  # a checkpoint can be saved (after :func:`enter_training`)
    previous: dict = {}


_state = _Requests()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum: int, frame) -> None:
    now = time.monotonic()
    if _state.signum:
        if now - _state.received_at < REPEAT_WINDOW_S:
            return  # the same request, passed on by a launcher
        sys.stderr.write(
            f"stopped by a second {signal_name(signum)}: exiting at once, without a checkpoint\n"
        )
        sys.stderr.flush()
        os._exit(128 + signum)
    _state.signum, _state.received_at = signum, now
    if not _state.training:
        raise StoppedBySignal(
            signum, f"stopped by {signal_name(signum)} before training began; nothing was saved"
        )


def install() -> None:
    """Take SIGTERM and SIGINT for this process (from the main thread; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state.signum, _state.training = 0, False
    for sig in SIGNALS:
        prev = signal.signal(sig, _handler)
        if prev is not _handler:
            _state.previous[sig] = prev


def uninstall() -> None:
    """Give SIGTERM and SIGINT back to the handlers they had before :func:`install`."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, prev in _state.previous.items():
        signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
    _state.previous = {}
    _state.signum, _state.training = 0, False


def enter_training() -> None:
    """From now on a signal is a request (:func:`stop_requested`) instead of a stop: the loop can
    save a checkpoint (call it once the training state is in place, before the first step)."""
    _state.training = True


def local_request() -> int:
    """The signal this process received (0: none)."""
    return _state.signum


def stop_requested() -> int:
    """The signal any rank received (0: none). Collective when distributed: every rank calls it
    at the same point (the end of a step), so all of them stop after the same step."""
    mine = _state.signum
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return mine
    if torch.distributed.get_world_size() == 1:
        return mine
    flag = torch.tensor([mine], dtype=torch.int64, device=device())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return int(flag.item())


def stop_message(signum: int, step: int, total: int, state_root) -> str:
    """The line a run stopped after ``step`` prints."""
    return (
        f"stopped by {signal_name(signum)} after step {step} of {total}: a resumable checkpoint "
        f"is in {state_root} (step-{step}); run the same command to resume"
    )
