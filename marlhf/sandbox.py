"""Run untrusted Python (model-generated programs) in a separate, restricted process.

Used by :mod:`marlhf.code_reward` to score APPS programs for MA-PPO. ``run_python`` starts one fresh
interpreter per call and returns an :class:`ExecResult` whose ``status`` is one of ``ok``,
``compile_error``, ``runtime_error``, ``timeout``, ``memory``, ``output_limit`` or ``blocked``.

Layers, and what each one protects
----------------------------------
The parent checks syntax with ``compile()`` (never executes), then starts
``python -I -S -B -X utf8 -c <bootstrap>`` in a new temporary directory. The small bootstrap sets
up the layers below *before* it reads and executes the user program (``solution.py``).

1. **Process** (parent): a fresh interpreter per run, started in a new session
   (``start_new_session``) so the wall-clock timeout kills the whole process group with SIGKILL;
   output is read through pipes with a byte cap (``max_output_bytes``, stdout + stderr together), so
   printing gigabytes cannot fill the trainer's memory; ``close_fds``. The environment is replaced
   by a minimal one (``LC_ALL``, ``PATH``, ``HOME``/``TMPDIR`` = work dir), and ``-I`` (isolated: no
   ``PYTHON*`` variables, no user site, no script dir on ``sys.path``) plus ``-S`` (no site-packages)
   mean no secret of the parent environment and no project module is visible. The work dir is a
   fresh ``tempfile.mkdtemp`` and is removed afterwards.
2. **Resource limits** (``resource.setrlimit`` in the child): address space (``memory_mb``), CPU
   seconds, file size, open files, core dumps off, and ``RLIMIT_NPROC=0`` (effective for non-root
   only: the kernel exempts uid 0, which is what we run as here and in CI; layers 4-5 cover root).
   Python's int/str digit limit is lifted instead (APPS tests hold 9000+ digit integers, written
   for Pythons without it); the CPU limit bounds what a huge conversion can cost.
3. **Namespaces** (``unshare`` through ctypes; needs root / CAP_SYS_ADMIN, skipped otherwise):
   a new *network* namespace with no interfaces up, so even 127.0.0.1 is unreachable; a new *mount*
   namespace in which every mount is remounted read-only except the work dir, and ``/proc``, the
   project root and the parent's working directory are covered by empty read-only tmpfs mounts (so
   ``/proc/<pid>/environ`` of the trainer and project files cannot be read at the kernel level).
4. **seccomp filter** (x86-64 and aarch64; installed through ``prctl`` with ctypes, skipped on
   other architectures): the kernel refuses with EPERM ``fork``/``vfork``/``clone`` without
   ``CLONE_THREAD`` (threads still work), ``execve``/``execveat``, ``socket``/``socketpair``/
   ``connect``/``bind``, ``kill``/``tkill``/``tgkill`` aimed at any other process, ``ptrace``,
   raising resource limits, ``unshare``/``setns``/``mount``/``chroot``, ``io_uring``, ``bpf``,
   ``open_by_handle_at``, module loading and a few more; ``clone3`` returns ENOSYS so glibc falls
   back to ``clone`` for threads; syscalls of a foreign ABI (i386 ``int 0x80``, x32) kill the process.
   This is what stops a fork bomb as root.
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
  the syscall surface but is a deny list, not an allow list.
* Memory-corruption bugs in CPython or its C extensions, which can bypass the audit hook (the hook
  is in-process). Layers 3-4 still hold in that case, but without the mount namespace (not root)
  such a program could read any world-readable file, and as root without it, write files.
* Covert resource use below the limits: the program can use a full CPU core for ``timeout_s`` and
  ``memory_mb`` of memory; many concurrent runs multiply that. There is no cgroup accounting, so the
  address-space limit is not a limit on page-cache or kernel memory.
* Timing side channels, reading the Python installation (it is readable by design), and anything
  reachable through file descriptors inherited on purpose (stdin, stdout, stderr only).
* When namespaces or seccomp are unavailable (not root, another architecture, a kernel without
  them), only layers 1, 2 and 5 remain. Run untrusted code from the internet inside a real container.

Example:
    >>> r = run_python("print(int(input()) * 2)", "21\\n", timeout_s=5.0)
    >>> (r.status, r.stdout)
    ('ok', '42\\n')
    >>> run_python("def f(:\\n  pass").status
    'compile_error'
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

Status = Literal[
    "ok", "compile_error", "runtime_error", "timeout", "memory", "output_limit", "blocked"
]

BLOCKED_MARKER = "[sandbox] blocked:"
MEMORY_MARKER = "[sandbox] memory-error"

# Layers that tests may switch off one at a time to check the others hold on their own.
LAYERS = ("audit", "seccomp", "namespaces")

_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# The bootstrap runs in the child as ``python -I -S -B -X utf8 -c BOOTSTRAP CONFIG_JSON``. It only
# uses modules already needed by the interpreter or loaded before any restriction is in place.
_BOOTSTRAP = r"""
import sys, os, json, resource, ctypes, traceback, builtins
def _setup(cfg):
    W = os.path.realpath(cfg["workdir"])
    skip = set(cfg["skip"])
    lim = [
        (resource.RLIMIT_AS, cfg["as_bytes"]),
        (resource.RLIMIT_CPU, cfg["cpu_s"]),
        (resource.RLIMIT_FSIZE, cfg["fsize"]),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, 0),
    ]
    for res, soft in lim:
        hard = soft + 1 if res == resource.RLIMIT_CPU else soft
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            pass
    roots = []
    for p in sys.path:
        if p and os.path.exists(p):
            roots.append(os.path.realpath(p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if "namespaces" not in skip:
        _namespaces(libc, W, roots, cfg["hide"])
    if "seccomp" not in skip:
        _seccomp(libc)
    if "audit" not in skip:
        _audit(W, tuple(roots))

def _namespaces(libc, W, roots, hide):
    CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        libc.unshare(CLONE_NEWNET)
        return
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return
    wb = W.encode()
    libc.mount(wb, wb, None, MS_BIND, None)
    os.chdir(W)  # the old cwd handle points below the new bind mount
    with open("/proc/self/mountinfo", "rb") as f:
        mps = [l.split(b" ")[4] for l in f.read().splitlines()]
    for mp in mps:
        mp = mp.replace(b"\\040", b" ").replace(b"\\011", b"\t").replace(b"\\012", b"\n").replace(b"\\134", b"\\")
        if mp != wb:
            libc.mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    keep = [W] + list(roots)
    for h in hide:
        h = os.path.realpath(h)
        if h == "/" or not os.path.isdir(h):
            continue
        if any(k == h or k.startswith(h + "/") for k in keep):
            continue
        libc.mount(b"none", h.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=0555")

def _seccomp(libc):
    import platform, struct
    m = platform.machine()
    EPERM, ENOSYS = 1, 38
    if m == "x86_64":
        arch, fork_like = 0xC000003E, (57, 58)
        nr = dict(clone=56, clone3=435, execve=59, execveat=322, socket=41, socketpair=53, connect=42,
                  bind=49, ptrace=101, kill=62, tkill=200, tgkill=234, setrlimit=160, prlimit64=302)
        deny = [272, 308, 165, 166, 155, 161, 304, 303, 310, 311, 321, 298, 425, 426, 427, 250, 248,
                249, 175, 313, 176, 246, 169, 323, 133, 259, 424, 167, 168, 172, 173, 434, 438]
    elif m in ("aarch64", "arm64"):
        arch, fork_like = 0xC00000B7, ()
        nr = dict(clone=220, clone3=435, execve=221, execveat=281, socket=198, socketpair=199, connect=203,
                  bind=200, ptrace=117, kill=129, tkill=130, tgkill=131, setrlimit=164, prlimit64=261)
        deny = [97, 268, 40, 39, 41, 51, 265, 264, 270, 271, 280, 241, 425, 426, 427, 219, 217, 218,
                105, 273, 106, 104, 142, 282, 33, 424, 224, 225, 434, 438]
    else:
        return
    ALLOW, ERR, ERRNOSYS, KILL = 0x7FFF0000, 0x00050000 | EPERM, 0x00050000 | ENOSYS, 0x80000000
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    p = []
    def ins(code, k, jt=0, jf=0):
        p.append((code, jt, jf, k))
    ins(LD, 4)  # seccomp_data.arch
    ins(JEQ, arch, 1, 0)
    ins(RET, KILL)
    ins(LD, 0)  # seccomp_data.nr
    ins(JGE, 0x40000000, 0, 1)  # x32 ABI numbers
    ins(RET, ERR)
    for n in list(fork_like) + deny + [nr[k] for k in ("execve", "execveat", "socket", "socketpair", "connect", "bind", "ptrace", "setrlimit")]:
        ins(JEQ, n, 0, 1)
        ins(RET, ERR)
    ins(JEQ, nr["clone3"], 0, 1)
    ins(RET, ERRNOSYS)
    # clone: threads only (args[0] has CLONE_THREAD)
    ins(JEQ, nr["clone"], 0, 4)
    ins(LD, 16)
    ins(JSET, 0x10000, 0, 1)
    ins(RET, ALLOW)
    ins(RET, ERR)
    # signals: only to this process (args[0] == own pid)
    pid = os.getpid()
    for k in ("kill", "tkill", "tgkill"):
        ins(JEQ, nr[k], 0, 4)
        ins(LD, 16)
        ins(JEQ, pid, 0, 1)
        ins(RET, ALLOW)
        ins(RET, ERR)
    # prlimit64: reading only (args[2], the new limit, must be NULL)
    ins(JEQ, nr["prlimit64"], 0, 6)
    ins(LD, 32)
    ins(JEQ, 0, 0, 3)
    ins(LD, 36)
    ins(JEQ, 0, 0, 1)
    ins(RET, ALLOW)
    ins(RET, ERR)
    ins(RET, ALLOW)
    buf = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in p))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(len(p), ctypes.addressof(buf))
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    libc.prctl(38, 1, None, 0, 0)  # PR_SET_NO_NEW_PRIVS
    libc.prctl(22, 2, ctypes.byref(prog), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER

def _audit(W, roots):
    realpath, fspath, write = os.path.realpath, os.fspath, os.write
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
    read_roots = (W,) + roots
    DENY = frozenset((
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
        "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn",
        "socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.gethostbyname_ex", "socket.getnameinfo", "socket.sendto",
        "socket.sendmsg", "socket.socketpair", "resource.setrlimit", "resource.prlimit",
        "code.__new__", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.symlink",
        "os.link", "os.chroot", "os.mkfifo", "os.mknod", "fcntl.ioctl", "os.chdir", "sys._current_frames",
        "syslog.openlog", "winreg.OpenKey", "webbrowser.open", "urllib.Request", "ftplib.connect",
        "http.client.connect", "smtplib.connect", "telnetlib.Telnet.open", "imaplib.open", "poplib.connect",
        "nntplib.connect", "_posixsubprocess.fork_exec",
    ))
    WRITE_PATH = frozenset((
        "os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown", "os.truncate",
        "os.utime", "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree",
        "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.chown", "shutil.make_archive",
    ))
    READ_PATH = frozenset(("os.listdir", "os.scandir", "os.listxattr", "glob.glob", "os.getxattr"))

    def inside(p, allowed):
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        p = realpath(p)
        return any(p == r or p.startswith(r + "/") for r in allowed)

    def deny(event, detail=""):
        try:
            write(2, ("\n[sandbox] blocked: %s %s\n" % (event, detail)).encode("utf-8", "replace"))
        except Exception:
            pass
        raise PermissionError("sandbox: %s is not allowed" % event)

    def is_path(a):
        return isinstance(a, (str, bytes, os.PathLike))

    def hook(event, args):
        if event in DENY or event.startswith("ctypes."):
            deny(event)
        elif event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            path = fspath(path)
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags >= 0 and flags & WRITE_FLAGS)
            ok = inside(path, (W,)) if writing else (inside(path, read_roots) or realpath(path) in DEVICES)
            if not ok:
                deny(event, repr(path))
        elif event in WRITE_PATH:
            for a in args:
                if is_path(a) and not inside(fspath(a), (W,)):
                    deny(event, repr(a))
        elif event in READ_PATH:
            a = args[0] if args else None
            if a is None:
                a = "."
            if is_path(a) and not inside(fspath(a), read_roots):
                deny(event, repr(a))

    sys.addaudithook(hook)

_cfg = json.loads(sys.argv[1])
with open(os.path.join(_cfg["workdir"], "solution.py"), "rb") as _f:
    _src = _f.read()
_MEM = b"\n[sandbox] memory-error\n"
if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)  # APPS has 9000+ digit numbers; RLIMIT_CPU bounds the cost
_setup(_cfg)
del _setup, _namespaces, _seccomp, _audit
sys.argv = ["solution.py"]
_g = {"__name__": "__main__", "__builtins__": builtins, "__file__": "solution.py"}
try:
    exec(compile(_src, "solution.py", "exec", dont_inherit=True), _g)
except SystemExit:
    raise
except MemoryError:
    os.write(2, _MEM)
    os._exit(1)
except BaseException as _e:
    try:
        traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    except BaseException:
        pass
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os._exit(1)
"""


def _minimal_env(workdir: str) -> dict[str, str]:
    return {"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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

    cpu_limit = max(1, int(-(-(cpu_s if cpu_s is not None else timeout_s + 1.0) // 1)))
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="marlhf-sandbox-"))
    proc = None
    try:
        with open(os.path.join(workdir, "solution.py"), "w", encoding="utf-8") as f:
            f.write(source)
        stdin_path = os.path.join(workdir, "stdin.txt")
        with open(stdin_path, "w", encoding="utf-8") as f:
            f.write(stdin)
        cfg = {
            "workdir": workdir,
            "as_bytes": memory_mb << 20,
            "cpu_s": cpu_limit,
            "fsize": max_output_bytes,
            "hide": ["/proc", _PROJECT_ROOT, os.getcwd()],
            "skip": list(_skip_layers),
        }
        cmd = [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(cfg)]
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
            )
        out, err, reason = _collect(proc, t0 + timeout_s, max_output_bytes)
        # Kill the group before reaping the leader, so its pgid cannot have been reused.
        _kill_group(proc.pid)
        returncode = proc.wait()
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        status: Status = reason or _classify(returncode, stderr)  # type: ignore[assignment]
        return ExecResult(status, stdout, stderr, returncode, time.monotonic() - t0)
    finally:
        if proc is not None:
            if proc.returncode is None:
                _kill_group(proc.pid)
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        shutil.rmtree(workdir, ignore_errors=True)
