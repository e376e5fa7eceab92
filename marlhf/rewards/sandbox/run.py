"""Run untrusted Python (model-generated programs) in a separate, restricted process.

Used by :mod:`marlhf.rewards.code` to score APPS programs for MA-PPO. ``run_python`` starts one fresh
interpreter per call and returns an :class:`ExecResult` whose ``status`` is one of ``ok``,
``compile_error``, ``runtime_error``, ``timeout``, ``memory``, ``output_limit`` or ``blocked``.

Layers, and what each one protects
----------------------------------
The parent checks syntax with ``compile()`` (never executes), then starts
``python -I -S -B -X utf8 -c <bootstrap>`` in a new temporary directory. The small bootstrap sets
up the layers below *before* it reads and executes the user program (``solution.py``). Two layers
use well-kept tools where the machine has them, and the built-in code otherwise:

* namespaces: **bubblewrap** (``bwrap``, Debian package ``bubblewrap``) when it is on ``PATH`` and
  runs here (probed once per process), else ``unshare`` through ctypes;
* seccomp: an **allow-list** filter built with **libseccomp's Python bindings** (``seccomp`` from
  Debian's ``python3-seccomp``, used from the system's dist-packages when its ABI matches this
  Python, or ``pyseccomp`` from PyPI) when found, else the built-in deny-list BPF program.

Each run reports the layers that were in place (``ExecResult.layers``, written by the child on a
pipe it closes before the program starts); the first run of a process logs them, e.g.
``sandbox layers: die-with-parent, process, rlimits, namespaces:bwrap,
seccomp:libseccomp-allowlist, audit``, and :func:`sandbox_layers` returns them.

1. **Process** (parent): a fresh interpreter per run, started in a new session
   (``start_new_session``) so the wall-clock timeout kills the whole process group with SIGKILL;
   output is read through pipes with a byte cap (``max_output_bytes``, stdout + stderr together), so
   printing gigabytes cannot fill the trainer's memory; ``close_fds``. The environment is replaced
   by a minimal one (``LC_ALL``, ``PATH``, ``HOME``/``TMPDIR`` = work dir), and ``-I`` (isolated: no
   ``PYTHON*`` variables, no user site, no script dir on ``sys.path``) plus ``-S`` (no site-packages)
   mean no secret of the parent environment and no project module is visible. The work dir is a
   fresh ``tempfile.mkdtemp`` and is removed afterwards.
   **Dies with the trainer**: the child sets ``PR_SET_PDEATHSIG`` (SIGKILL) first thing and exits
   if its parent is already gone; under bwrap, ``--die-with-parent`` and a new pid namespace kill
   everything in the sandbox when the trainer dies, even by SIGKILL. Work dirs are named after
   their owner (``marlhf-sandbox-<pid ns>-<pid>-<start time>-*``); the first run of a process
   removes those whose owner is dead (:func:`clean_stale_workdirs`).
2. **Resource limits** (``resource.setrlimit`` in the child): address space (``memory_mb``), CPU
   seconds, file size, open files, core dumps off, and ``RLIMIT_NPROC=0`` (effective for non-root
   only: the kernel exempts uid 0, which is what we run as here and in CI; layers 4-5 cover root).
   Python's int/str digit limit is lifted instead (APPS tests hold 9000+ digit integers, written
   for Pythons without it); the CPU limit bounds what a huge conversion can cost.
3. **Namespaces**. With bwrap: new pid, network, IPC, UTS and mount namespaces, all capabilities
   dropped, ``/`` bound read-only, the work dir read-write, an empty read-only ``/proc``, a minimal
   read-only ``/dev``, and the project root and the parent's working directory covered by empty
   read-only tmpfs mounts. Built in (``unshare`` through ctypes; needs root / CAP_SYS_ADMIN,
   skipped otherwise): a new *network* namespace with no interfaces up, so even 127.0.0.1 is
   unreachable; a new *mount* namespace in which every mount is remounted read-only except the work
   dir, and ``/proc``, the project root and the parent's working directory are covered by empty
   read-only tmpfs mounts (so ``/proc/<pid>/environ`` of the trainer and project files cannot be
   read at the kernel level).
4. **seccomp filter**. With libseccomp: an allow-list (``SECCOMP_ALLOW``): file I/O, memory,
   threads (``clone`` with ``CLONE_THREAD`` only), time, signals to itself, identity queries and a
   few ``ioctl`` commands; every other syscall fails with EPERM, ``clone3`` with ENOSYS (glibc then
   uses ``clone``), other architectures' syscalls kill the process. Built in (x86-64 and aarch64;
   installed through ``prctl`` with ctypes, skipped on other architectures): a deny list that
   refuses with EPERM ``fork``/``vfork``/``clone`` without ``CLONE_THREAD`` (threads still work),
   ``execve``/``execveat``, ``socket``/``socketpair``/``connect``/``bind``,
   ``kill``/``tkill``/``tgkill`` aimed at any other process, ``ptrace``, raising resource limits,
   ``unshare``/``setns``/``mount``/``chroot``, ``io_uring``, ``bpf``, ``open_by_handle_at``,
   module loading and a few more; ``clone3`` returns ENOSYS; syscalls of a foreign ABI (i386
   ``int 0x80``, x32) kill the process. This is what stops a fork bomb as root.
5. **Audit hook** (``sys.addaudithook``; cannot be removed once installed): refuses process creation
   (``os.fork``, ``os.exec*``, ``os.posix_spawn``, ``os.system``, ``subprocess.Popen``, ...),
   sending signals (``os.kill``, ``os.killpg``), sockets and name resolution, ``ctypes`` (all events), ``code``
   object construction, ``gc`` introspection, ``resource.setrlimit``, links, ``open`` for writing
   outside the work dir and for reading outside the work dir and the Python installation, and path
   operations (list, remove, rename, chmod, ...) outside them. Each refusal raises
   ``PermissionError`` in the program *and* writes a ``[sandbox] blocked`` line to stderr, so the run
   is reported as ``blocked`` even if the program swallows the exception.

Any violation makes the status ``blocked`` (the program is scored as a failure). A ``MemoryError``
gives ``memory``; exceeding the CPU limit or the wall clock gives ``timeout``.

What this does NOT protect against (it is not a container or a VM)
-------------------------------------------------------------------
* Kernel exploits: the program runs as the same (root) user on the same kernel; seccomp narrows
  the syscall surface (to an allow list with libseccomp, a deny list without it).
* Memory-corruption bugs in CPython or its C extensions, which can bypass the audit hook (the hook
  is in-process). Layers 3-4 still hold in that case, but without the mount namespace (not root)
  such a program could read any world-readable file, and as root without it, write files.
* Covert resource use below the limits: the program can use a full CPU core for ``timeout_s`` and
  ``memory_mb`` of memory; many concurrent runs multiply that. There is no cgroup accounting, so the
  address-space limit is not a limit on page-cache or kernel memory.
* Timing side channels, reading the Python installation (it is readable by design), and anything
  reachable through file descriptors inherited on purpose (stdin, stdout, stderr only).
* When namespaces or seccomp are unavailable (not root and no working bwrap, another architecture,
  a kernel without them), only layers 1, 2 and 5 remain. Run untrusted code from the internet
  inside a real container.

Example:
    >>> r = run_python("print(int(input()) * 2)", "21\\n", timeout_s=5.0)
    >>> (r.status, r.stdout)
    ('ok', '42\\n')
    >>> run_python("def f(:\\n  pass").status
    'compile_error'
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Status = Literal[
    "ok", "compile_error", "runtime_error", "timeout", "memory", "output_limit", "blocked"
]

BLOCKED_MARKER = "[sandbox] blocked:"
MEMORY_MARKER = "[sandbox] memory-error"

# Layers that tests may switch off one at a time to check the others hold on their own.
LAYERS = ("audit", "seccomp", "namespaces")

_PROJECT_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed run.

    ``returncode`` is None when no process was started (compile error); negative values are the
    number of the signal that ended the process (``-9`` SIGKILL), as in :mod:`subprocess`.
    """

    status: Status
    stdout: str
    stderr: str
    returncode: int | None
    wall_s: float
    layers: tuple[str, ...] = ()  # the layers in place for this run (empty: the program never ran)


# The child program: run as ``python -I -S -B -X utf8 -c CHILD_SOURCE CONFIG_JSON`` (its text, read
# here; the child imports nothing of the project).
_BOOTSTRAP = (Path(__file__).parent / "child.py").read_text(encoding="utf-8")


# The allow-list of the libseccomp filter: every other syscall fails with EPERM. ``clone`` (threads
# only), ``kill``/``tkill``/``tgkill`` (own process only), ``prlimit64`` (read only) and ``ioctl``
# (the commands below) are allowed with argument checks; ``clone3`` gives ENOSYS. Names that are not
# syscalls of the machine's architecture are skipped. What CPython, its threads, its C extension
# modules (``_decimal``, ``_json``, ...) and a program's own files in the work dir need; nothing that
# creates processes, sockets or namespaces, mounts, traces, loads code into the kernel or changes
# credentials.
SECCOMP_ALLOW = (
    # files (confined to the work dir and read-only system files by the other layers)
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "open", "openat", "close", "close_range", "lseek", "fstat", "stat", "lstat",
    "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "readlink",
    "readlinkat", "getcwd", "chdir", "fchdir", "getdents64", "fcntl", "flock", "dup", "dup2",
    "dup3", "pipe", "pipe2", "fsync", "fdatasync", "ftruncate", "fadvise64", "sendfile",
    "copy_file_range", "umask", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "rename",
    "renameat", "renameat2",
    # waiting and polling on the descriptors it has
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd2",
    # memory
    "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "msync", "membarrier",
    # threads and scheduling
    "futex", "futex_waitv", "set_robust_list", "get_robust_list", "rseq", "set_tid_address",
    "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "getcpu",
    # time
    "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time",
    "times", "getrusage", "getitimer", "setitimer", "alarm", "pause", "timer_create",
    "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete",
    # signals (to itself: kill/tkill/tgkill are allowed with an argument check)
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigsuspend", "sigaltstack", "restart_syscall",
    # identity and system information (read only)
    "getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid", "getgroups",
    "getresuid", "getresgid", "getpgrp", "getpgid", "getsid", "uname", "sysinfo", "getrandom",
    "getrlimit",
    "exit", "exit_group",
)  # fmt: skip
# ioctl commands: TCGETS (isatty), TIOCGWINSZ (terminal size), FIONREAD, FIONBIO, FIONCLEX, FIOCLEX.
SECCOMP_IOCTLS = (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)

WORKDIR_PREFIX = "marlhf-sandbox-"
# marlhf-sandbox-<pid namespace inode>-<owner pid>-<owner start time>-<random>
_WORKDIR_RE = re.compile(re.escape(WORKDIR_PREFIX) + r"(\d+)-(\d+)-(\d+)-")


def _minimal_env(workdir: str) -> dict[str, str]:
    return {"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir}


# --- tools: bubblewrap and libseccomp's Python bindings, where present ---------------------------
@dataclass(frozen=True)
class Tools:
    """What the sandbox found on this machine: a working ``bwrap`` (its path) and libseccomp's
    Python bindings (``{"name": module name, "path": its file}``); ``None`` where absent."""

    bwrap: str | None
    seccomp: dict | None


_tools_lock = threading.Lock()
_tools_cache: dict[int, Tools] = {}


def find_seccomp_bindings() -> dict | None:
    """libseccomp's Python bindings: ``seccomp`` (libseccomp's own, Debian ``python3-seccomp``) or
    ``pyseccomp`` (PyPI, the same API through ctypes), importable here or, for Debian's package
    built for the system Python, its extension module when it matches this interpreter's ABI."""
    for name in ("seccomp", "pyseccomp"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            found = {"name": name, "path": spec.origin}
            if name == "pyseccomp":
                libs = {n: ctypes.util.find_library(n) for n in ("c", "seccomp")}
                found["libs"] = {n: p for n, p in libs.items() if p}
            return found
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for d in (
        "/usr/lib/python3/dist-packages",
        f"/usr/lib64/{ver}/site-packages",
        f"/usr/lib/{ver}/site-packages",
    ):
        path = os.path.join(d, "seccomp" + suffix)
        if os.path.isfile(path):
            return {"name": "seccomp", "path": path}
    return None


def _stdlib_roots() -> list[str]:
    """Where the child interpreter (``-I -S``) imports from: never hidden by a tmpfs."""
    paths = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    return sorted(os.path.realpath(p) for p in paths if p)


def _bwrap_argv(
    bwrap: str, workdir: str | None, hide: list[str], bindings: str | None
) -> list[str]:
    """bubblewrap: new pid, network, IPC, UTS and mount namespaces, no capabilities, the whole file
    system read-only except the work dir, an empty /proc, a minimal /dev, and ``hide`` covered by
    empty read-only tmpfs mounts; the sandbox is SIGKILLed when its parent (the trainer) dies."""
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL", "--ro-bind", "/", "/"]
    argv += ["--dev", "/dev", "--remount-ro", "/dev", "--tmpfs", "/proc", "--remount-ro", "/proc"]
    keep = [workdir] if workdir else []
    keep += _stdlib_roots()
    for h in sorted({os.path.realpath(h) for h in hide}):
        if h == "/" or not os.path.isdir(h) or any(h == k or h.startswith(k + "/") for k in keep):
            continue
        argv += ["--tmpfs", h]
        # what must stay visible inside a hidden directory (a virtualenv inside the project: its
        # lib/pythonX.Y; the seccomp bindings) is bound back read-only over the empty tmpfs
        for k in [*keep, *([bindings] if bindings else [])]:
            if k.startswith(h + "/") and os.path.exists(k):
                argv += ["--ro-bind", k, k]
        argv += ["--remount-ro", h]
    if workdir:
        argv += ["--bind", workdir, workdir, "--chdir", workdir]
    return argv


def _probe_bwrap() -> str | None:
    """Path of ``bwrap`` if it runs here with the namespaces we use (it needs root or unprivileged
    user namespaces), else None (a warning names the reason)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    argv = _bwrap_argv(path, None, [], None) + [sys.executable, "-I", "-S", "-c", "pass"]
    try:
        r = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env=_minimal_env("/")
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("sandbox: %s does not run here (%s); using the built-in namespaces", path, e)
        return None
    if r.returncode != 0:
        err = r.stderr.decode("utf-8", "replace").strip()[:300]
        log.warning("sandbox: %s fails here (%s); using the built-in namespaces", path, err)
        return None
    return path


def tools() -> Tools:
    """The tools the sandbox uses in this process (probed once)."""
    pid = os.getpid()
    with _tools_lock:
        if pid not in _tools_cache:
            _tools_cache[pid] = Tools(_probe_bwrap(), find_seccomp_bindings())
        return _tools_cache[pid]


_layers_lock = threading.Lock()
_layers_logged: set[tuple[str, ...]] = set()


def _note_layers(layers: tuple[str, ...]) -> None:
    """Log the layers in place once per distinct set (the first in a process: info)."""
    with _layers_lock:
        if layers in _layers_logged:
            return
        first = not _layers_logged
        _layers_logged.add(layers)
    if first:
        log.info("sandbox layers: %s", ", ".join(layers))
    else:
        log.warning("sandbox layers changed: %s", ", ".join(layers))


def sandbox_layers() -> tuple[str, ...]:
    """Run an empty program and return the layers that were in place (what the log states)."""
    return run_python("pass", timeout_s=30.0).layers


# --- work dirs: named after their owner, so a dead owner's dirs can be found and removed ---------
def _process_start_time(pid: int) -> int | None:
    """Start time of a live (not zombie) process in clock ticks since boot, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _make_workdir() -> str:
    pid = os.getpid()
    prefix = f"{WORKDIR_PREFIX}{_pid_namespace() or 0}-{pid}-{_process_start_time(pid) or 0}-"
    return os.path.realpath(tempfile.mkdtemp(prefix=prefix))


def _pids_using(path: str) -> list[int]:
    """Live processes whose command line holds ``path`` (a sandbox's unique work dir)."""
    needle = path.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def clean_stale_workdirs(tmpdir: str | None = None) -> list[str]:
    """Remove the work dirs whose owner process (a trainer) is dead, after killing any process still
    running in them; returns the removed paths.

    Only dirs named by this version (``marlhf-sandbox-<pid ns>-<pid>-<start time>-*``) and owned
    in this pid namespace are touched: a live owner (same pid and start time) keeps its dirs."""
    ns = _pid_namespace()
    if ns is None:
        return []
    removed = []
    for path in sorted(
        glob.glob(os.path.join(tmpdir or tempfile.gettempdir(), WORKDIR_PREFIX + "*"))
    ):
        m = _WORKDIR_RE.match(os.path.basename(path))
        if m is None or int(m.group(1)) != ns or not os.path.isdir(path):
            continue
        pid, start = int(m.group(2)), int(m.group(3))
        if _process_start_time(pid) == start:
            continue
        for orphan in _pids_using(path):
            try:
                os.kill(orphan, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        log.warning("sandbox: removed %d work dirs of dead trainers: %s", len(removed), removed)
    return removed


_cleaned: set[int] = set()


def _clean_once() -> None:
    """Clean stale work dirs at the first sandboxed run of a process."""
    with _tools_lock:
        if os.getpid() in _cleaned:
            return
        _cleaned.add(os.getpid())
    clean_stale_workdirs()


# --- processes ------------------------------------------------------------------------------------
def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _stop(proc: subprocess.Popen, in_bwrap: bool) -> None:
    """SIGKILL the sandboxed processes; leaves ``proc`` unreaped (see ``_exited``).

    Under bwrap the process is bwrap itself: killing its child (pid 1 of the sandbox's pid
    namespace) makes the kernel kill everything in the namespace and bwrap reap it and exit, so no
    process is left for init to reap. The group is killed in any case."""
    if in_bwrap and not _exited(proc.pid):
        for child in _children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 2.0
        while not _exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
    _kill_group(proc.pid)


def _exited(pid: int) -> bool:
    """True once ``pid`` has exited; leaves it unreaped (WNOWAIT) so its group id stays reserved."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _collect(
    proc: subprocess.Popen, deadline: float, max_bytes: int
) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until both close and the child exits, the deadline passes
    (``"timeout"``) or more than ``max_bytes`` arrive in total (``"output_limit"``)."""
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    reason = None
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            for key, _ in sel.select(timeout=left):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fd)
                    continue
                total += len(data)
                if total > max_bytes:
                    reason = "output_limit"
                    break
                chunks[key.fd].append(data)
            if reason:
                break
    while reason is None and not _exited(proc.pid):
        if time.monotonic() >= deadline:
            reason = "timeout"
        else:
            time.sleep(0.002)
    out = b"".join(chunks[proc.stdout.fileno()])
    err = b"".join(chunks[proc.stderr.fileno()])
    return out, err, reason


def _exit_status(returncode: int, in_bwrap: bool) -> int:
    """bwrap exits with 128 + n when the program was killed by signal n: report ``-n`` as for a
    direct child (a program that calls ``sys.exit(137)`` reads as killed too, a failure either way)."""
    if in_bwrap and 128 < returncode <= 128 + 64:
        return 128 - returncode
    return returncode


def _classify(returncode: int, stderr: str) -> Status:
    if BLOCKED_MARKER in stderr:
        return "blocked"
    if MEMORY_MARKER in stderr:
        return "memory"
    if returncode == 0:
        return "ok"
    if returncode == -signal.SIGXCPU:
        return "timeout"
    if returncode == -signal.SIGKILL:
        # Not killed by us (we only kill on timeout / output limit): the CPU hard limit or the OOM killer.
        return "memory"
    if returncode == -signal.SIGXFSZ:
        return "output_limit"
    return "runtime_error"


def _command(
    workdir: str,
    limits: dict,
    skip: tuple[str, ...],
    bindings: dict | None,
    bwrap: str | None,
    status_fd: int,
) -> list[str]:
    """The child's command line: the bootstrap with its JSON config, inside bwrap if given."""
    hide = ["/proc", _PROJECT_ROOT, os.getcwd()]
    cfg = {
        "workdir": workdir,
        **limits,
        "hide": hide,
        "skip": list(skip),
        "parent_pid": None if bwrap else os.getpid(),
        "bwrap": bwrap is not None,
        "status_fd": status_fd,
        "seccomp_bindings": bindings,
        "seccomp_allow": SECCOMP_ALLOW,
        "seccomp_ioctls": SECCOMP_IOCTLS,
    }
    # under bwrap the interpreter's real file: a virtualenv's bin/python may lie in the hidden project
    exe = os.path.realpath(sys.executable) if bwrap else sys.executable
    cmd = [exe, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(cfg)]
    if bwrap:
        # /proc is covered by bwrap itself
        cmd = [*_bwrap_argv(bwrap, workdir, hide[1:], bindings and bindings["path"]), "--", *cmd]
    return cmd


def run_python(
    source: str,
    stdin: str = "",
    *,
    timeout_s: float = 4.0,
    memory_mb: int = 512,
    cpu_s: float | None = None,
    max_output_bytes: int = 1 << 20,
    _skip_layers: tuple[str, ...] = (),
) -> ExecResult:
    """Run ``source`` as ``__main__`` in a sandboxed interpreter with ``stdin`` as its standard input.

    Args:
        source: the program text.
        stdin: text fed to standard input (UTF-8).
        timeout_s: wall-clock limit, interpreter start-up included; the process group is killed.
        memory_mb: address-space limit (RLIMIT_AS) in MiB.
        cpu_s: CPU-seconds limit (RLIMIT_CPU, whole seconds, rounded up); default ``timeout_s + 1``.
        max_output_bytes: cap on stdout + stderr together, and on any file the program writes.
        _skip_layers: names from ``LAYERS`` to switch off; for the sandbox's own tests only.

    Returns:
        ExecResult; stdout/stderr are decoded as UTF-8 with replacement.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if memory_mb < 32:
        raise ValueError(f"memory_mb must be >= 32, got {memory_mb}")
    if max_output_bytes < 1:
        raise ValueError(f"max_output_bytes must be >= 1, got {max_output_bytes}")
    unknown = set(_skip_layers) - set(LAYERS)
    if unknown:
        raise ValueError(f"unknown sandbox layers {sorted(unknown)}; known: {LAYERS}")
    t0 = time.monotonic()
    try:
        compile(source, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
        return ExecResult(
            "compile_error", "", f"{type(e).__name__}: {e}", None, time.monotonic() - t0
        )

    _clean_once()
    found = tools()
    bwrap = None if "namespaces" in _skip_layers else found.bwrap
    workdir = _make_workdir()
    proc = None
    status_r, status_w = os.pipe()
    try:
        with open(os.path.join(workdir, "solution.py"), "w", encoding="utf-8") as f:
            f.write(source)
        stdin_path = os.path.join(workdir, "stdin.txt")
        with open(stdin_path, "w", encoding="utf-8") as f:
            f.write(stdin)
        limits = {
            "as_bytes": memory_mb << 20,
            "cpu_s": max(1, int(-(-(cpu_s if cpu_s is not None else timeout_s + 1.0) // 1))),
            "fsize": max_output_bytes,
        }
        cmd = _command(workdir, limits, _skip_layers, found.seccomp, bwrap, status_w)
        with open(stdin_path, "rb") as fin:
            proc = subprocess.Popen(
                cmd,
                stdin=fin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_minimal_env(workdir),
                start_new_session=True,
                close_fds=True,
                pass_fds=(status_w,),
            )
        os.close(status_w)
        status_w = -1
        out, err, reason = _collect(proc, t0 + timeout_s, max_output_bytes)
        # Kill the group before reaping the leader, so its pgid cannot have been reused.
        _stop(proc, bwrap is not None)
        returncode = _exit_status(proc.wait(), bwrap is not None)
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        status: Status = reason or _classify(returncode, stderr)  # type: ignore[assignment]
        layers = _read_layers(status_r)
        if layers and not _skip_layers:
            _note_layers(layers)
        return ExecResult(status, stdout, stderr, returncode, time.monotonic() - t0, layers)
    finally:
        if status_w >= 0:
            os.close(status_w)
        os.close(status_r)
        if proc is not None:
            if proc.returncode is None:
                _stop(proc, bwrap is not None)
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _read_layers(fd: int) -> tuple[str, ...]:
    """The layers the child reported on its status pipe (it writes them before the program runs)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
    except BlockingIOError:
        pass
    try:
        layers = json.loads(data.decode()) if data else []
    except ValueError:
        return ()
    return tuple(str(x) for x in layers)
