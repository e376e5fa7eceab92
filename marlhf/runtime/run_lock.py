"""One run per output directory: a lock file in it that names its holder.

Two runs writing into one ``--output_dir`` interleave their metrics and checkpoints and the last
one to save wins. Every stage (and the demo) therefore takes ``<output_dir>/.marlhf.lock`` before
it writes anything there, and a second run stops with one line naming the holder::

    error: --output_dir out/ppo is in use by another run: PID 4242 on host gpu-3 since
    2026-01-31 12:00:00 (python -m marlhf.stages.ppo ...); wait for it to end or pass another
    --output_dir (if that process is gone, delete out/ppo/.marlhf.lock)

The lock file is created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and on NFS v3 and
later) and holds the holder's PID, host, boot id and process start time, the command line and a
token shared by the ranks of the run. It is removed when the process exits (``atexit``). A lock
left by a process that died (SIGKILL, a crash, a reboot) is *stale*: on the holder's host a PID
that no longer runs, or runs a process started at another time (the PID was reused), or another
boot id means the holder is gone, and the lock is taken over with a warning. A holder on another
host cannot be checked from here: the message says so and which file to delete.

Ranks: one lock per run, not per rank. Rank 0 takes it; then the first rank of every other node
(``LOCAL_RANK`` 0) looks at the directory: when it sees rank 0's lock the directory is shared (one
filesystem, e.g. NFS); when it does not, the directory is node-local and that rank takes a lock
there too, with the same token. A failure on any rank stops every rank (:func:`lock_output_dir`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shlex
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from marlhf.runtime.distributed import all_gather_object, rank

log = logging.getLogger("marlhf.runtime.run_lock")

LOCK_FILE = ".marlhf.lock"
_UNREADABLE_GRACE_S = 10.0  # a lock file being written right now may be empty for a moment


class OutputDirInUse(ValueError):
    """The output directory is locked by another run (an input error: pick another directory)."""


class OutputDirUnusable(ValueError):
    """The output directory cannot be created or written: a file, read-only, immutable, ... (an
    input error: pick another directory)."""


def unusable_problem(directory: Path, err: OSError, flag: str = "--output_dir") -> str:
    """One line on why ``directory`` could not be created or locked (``err``), naming ``flag``."""
    blocker = next((p for p in (directory, *directory.parents) if p.is_file()), None)
    if blocker == directory:
        return f"{flag} {directory}: is a file, not a directory; pass a directory (it is created when missing)"
    if blocker is not None:
        return f"{flag} {directory}: {blocker} is a file, not a directory; pass another {flag}"
    where = err.filename or directory
    reason = err.strerror or type(err).__name__
    return (
        f"{flag} {directory}: cannot write there ({reason}: {where}); pass a directory this run "
        f"may write to as {flag}"
    )


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: written into the lock file as JSON."""

    pid: int
    host: str
    boot_id: str
    started: str  # the process's start time (/proc/<pid>/stat, clock ticks since boot)
    since: float  # when the lock was taken (time.time())
    command: str
    token: str  # shared by the ranks of one run

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        command = self.command if len(self.command) <= 120 else self.command[:117] + "..."
        return f"PID {self.pid} on host {self.host} since {when} ({command})"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` (field 22 of /proc/<pid>/stat), "" when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]  # fields after the command name start at field 3


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def this_process(token: str) -> Holder:
    pid = os.getpid()
    return Holder(
        pid=pid,
        host=socket.gethostname(),
        boot_id=_boot_id(),
        started=_process_start(pid),
        since=time.time(),
        command=shlex.join([Path(sys.executable).name, *sys.argv]),
        token=token,
    )


def holder_alive(holder: Holder) -> bool | None:
    """Whether the holder still runs: True, False, or None when that cannot be told from here
    (another host)."""
    if holder.host != socket.gethostname():
        return None
    if holder.boot_id and _boot_id() and holder.boot_id != _boot_id():
        return False  # the host rebooted since
    if not _pid_runs(holder.pid):
        return False
    started = _process_start(holder.pid)
    return not (holder.started and started and started != holder.started)


def read_holder(path: Path) -> Holder | None:
    """The holder recorded in lock file ``path`` (None: unreadable or not a lock file)."""
    try:
        data = json.loads(path.read_text())
        return Holder(**{k: data[k] for k in Holder.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _create(path: Path, holder: Holder) -> bool:
    """Create lock file ``path`` holding ``holder``; False when it exists already."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(holder), f)
        f.flush()
        os.fsync(f.fileno())
    return True


def _remove_stale(path: Path, why: str) -> None:
    """Take a stale lock away: renamed first (atomic: of two runs that both found it stale, one
    renames it, the other finds it gone and retries its own create), then deleted."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    aside.unlink(missing_ok=True)
    log.warning("%s: %s; the lock is taken over", path, why)


def acquire(directory: str | Path, token: str, flag: str = "--output_dir") -> Path:
    """Lock ``directory`` for the run ``token`` (kept until this process exits); returns the lock
    file. A lock of the same token (another rank of this run) is accepted as is.

    Raises:
        OutputDirInUse naming ``flag``, the directory and the holder.
    """
    directory = Path(directory)
    path = directory / LOCK_FILE
    me = this_process(token)
    for _ in range(20):
        if _create(path, me):
            atexit.register(release, path, token)
            return path
        holder = read_holder(path)
        if holder is None:
            try:
                age = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if age < _UNREADABLE_GRACE_S:
                time.sleep(0.2)  # being written by its holder
                continue
            _remove_stale(path, "an unreadable lock file")
            continue
        if holder.token == token:
            return path
        alive = holder_alive(holder)
        if alive is False:
            _remove_stale(path, f"its holder, {holder.describe()}, is no longer running")
            continue
        where = "" if alive else f", which cannot be checked from host {me.host}"
        raise OutputDirInUse(
            f"{flag} {directory} is in use by another run: {holder.describe()}{where}; wait for "
            f"it to end or pass another {flag} (if that process is gone, delete {path})"
        )
    raise OutputDirInUse(f"{flag} {directory}: could not take the lock {path}; try again")


def release(path: Path, token: str) -> None:
    """Remove lock file ``path`` if it still holds ``token``."""
    holder = read_holder(path)
    if holder is not None and holder.token == token:
        path.unlink(missing_ok=True)


def lock_output_dir(directory: str | Path, flag: str = "--output_dir") -> None:
    """Lock a run's output directory: rank 0's lock, plus one on every node where the directory
    is not the one rank 0 locked (node-local). Collective when distributed; every rank raises
    :class:`OutputDirInUse` when any lock could not be taken (held by another run), or
    :class:`OutputDirUnusable` when the directory cannot be created or written (a file, read-only,
    immutable: :func:`unusable_problem`). The directory exists afterwards on every rank that locked
    it."""
    directory = Path(directory)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    token = uuid.uuid4().hex if rank() == 0 else ""
    if distributed:
        token = all_gather_object(token)[0]

    def attempt(mine: bool) -> tuple[str, str] | None:
        if not mine:
            return None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            acquire(directory, token, flag)
        except OutputDirInUse as e:
            return "in use", str(e)
        except OSError as e:
            return "unusable", unusable_problem(directory, e, flag)
        return None

    problem = attempt(rank() == 0)
    if distributed:
        problem = next((p for p in all_gather_object(problem) if p), None)
    if problem is None and distributed and rank() != 0:
        local_first = int(os.environ.get("LOCAL_RANK", "0") or 0) == 0
        seen = read_holder(directory / LOCK_FILE)
        problem = attempt(local_first and (seen is None or seen.token != token))
    if distributed:
        problem = next((p for p in all_gather_object(problem) if p), None)
    if problem is not None:
        kind, text = problem
        raise (OutputDirInUse if kind == "in use" else OutputDirUnusable)(text)
