"""The sandbox's child program (:mod:`marlhf.rewards.sandbox.run`): it runs as
``python -I -S -B -X utf8 -c <this file's text> CONFIG_JSON``, never imported in the child (the
parent reads its text), so it uses only modules the interpreter needs anyway or loads before any
restriction is in place. In the child it dies with the trainer, applies the rlimits, namespaces,
seccomp filter and audit hook the parent's CONFIG_JSON asks for, reports the layers in place on a
pipe the program never sees, and runs ``solution.py`` from the work directory; its own names are
deleted before the program runs.
"""

import builtins
import ctypes
import ctypes.util
import importlib.util
import json
import os
import platform
import resource
import struct
import sys
import traceback


def _load_bindings(spec):
    # libseccomp's Python bindings, imported from their file (the interpreter runs with -I -S)
    if not spec:
        return None
    find = ctypes.util.find_library
    # pyseccomp looks its libraries up with find_library, which runs ldconfig: use the parent's answer
    ctypes.util.find_library = lambda n: spec.get("libs", {}).get(n) or find(n)
    try:
        s = importlib.util.spec_from_file_location(spec["name"], spec["path"])
        m = importlib.util.module_from_spec(s)
        s.loader.exec_module(m)
        return m
    except Exception:
        return None
    finally:
        ctypes.util.find_library = find


def _setup(cfg, libc):
    W = os.path.realpath(cfg["workdir"])
    skip = set(cfg["skip"])
    layers = (["die-with-parent"] if _pdeathsig or cfg["bwrap"] else []) + ["process", "rlimits"]
    sc = None if "seccomp" in skip else _load_bindings(cfg["seccomp_bindings"])
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
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    if cfg["bwrap"]:
        layers.append("namespaces:bwrap")
    elif "namespaces" not in skip:
        ns = _namespaces(libc, W, roots, cfg["hide"])
        if ns:
            layers.append(f"namespaces:unshare({ns})")
    if "seccomp" not in skip:
        if sc is not None and _seccomp_allowlist(sc, cfg["seccomp_allow"], cfg["seccomp_ioctls"]):
            layers.append("seccomp:libseccomp-allowlist")
        elif _seccomp(libc):
            layers.append("seccomp:bpf-denylist")
    if "audit" not in skip:
        _audit(W, tuple(roots))
        layers.append("audit")
    return layers


def _seccomp_allowlist(sc, allow, ioctls):
    # Every syscall not named here fails with EPERM; native architecture only (others: killed).
    EPERM, ENOSYS, CLONE_THREAD = 1, 38, 0x10000
    try:
        f = sc.SyscallFilter(sc.ERRNO(EPERM))
        for name in allow:
            try:
                f.add_rule(sc.ALLOW, name)
            except Exception:
                pass  # not a syscall of this architecture (e.g. open on aarch64)
        f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, CLONE_THREAD))
        f.add_rule(sc.ERRNO(ENOSYS), "clone3")  # glibc then falls back to clone for threads
        pid = os.getpid()
        for name in ("kill", "tkill", "tgkill"):
            f.add_rule(sc.ALLOW, name, sc.Arg(0, sc.EQ, pid))
        f.add_rule(sc.ALLOW, "prlimit64", sc.Arg(2, sc.EQ, 0))  # reading limits only
        for cmd in ioctls:
            f.add_rule(sc.ALLOW, "ioctl", sc.Arg(1, sc.EQ, cmd))
        f.load()
    except Exception:
        return False
    return True


def _namespaces(libc, W, roots, hide):
    CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        return "net" if libc.unshare(CLONE_NEWNET) == 0 else None
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "net"
    wb = W.encode()
    libc.mount(wb, wb, None, MS_BIND, None)
    os.chdir(W)  # the old cwd handle points below the new bind mount
    with open("/proc/self/mountinfo", "rb") as f:
        mps = [line.split(b" ")[4] for line in f.read().splitlines()]
    for mp in mps:
        mp = (
            mp.replace(b"\\040", b" ")
            .replace(b"\\011", b"\t")
            .replace(b"\\012", b"\n")
            .replace(b"\\134", b"\\")
        )
        if mp != wb:
            libc.mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    keep = [W] + list(roots)
    for h in hide:
        h = os.path.realpath(h)
        if h == "/" or not os.path.isdir(h):
            continue
        if any(k == h or k.startswith(h + "/") for k in keep):
            continue
        libc.mount(
            b"none",
            h.encode(),
            b"tmpfs",
            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            b"size=4k,mode=0555",
        )
    return "net,mount"


# fmt: off
def _seccomp(libc):
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
        return False
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
    libc.prctl(38, 1, None, 0, 0)  # PR_SET_NO_NEW_PRIVS
    return libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
# fmt: on


# fmt: off
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
            write(2, f"\n[sandbox] blocked: {event} {detail}\n".encode("utf-8", "replace"))
        except Exception:
            pass
        raise PermissionError(f"sandbox: {event} is not allowed")

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
# fmt: on


if __name__ == "__main__":
    _cfg = json.loads(sys.argv[1])
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    # Die with the trainer (SIGKILL when the parent exits), and exit now if it is already gone.
    _pdeathsig = _libc.prctl(1, 9, None, 0, 0) == 0  # PR_SET_PDEATHSIG, SIGKILL
    if _cfg["parent_pid"] is not None and os.getppid() != _cfg["parent_pid"]:
        os._exit(137)
    with open(os.path.join(_cfg["workdir"], "solution.py"), "rb") as _f:
        _src = _f.read()
    _MEM = b"\n[sandbox] memory-error\n"
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # APPS has 9000+ digit numbers; RLIMIT_CPU bounds the cost
    _layers = _setup(_cfg, _libc)
    # Report the layers in place on a pipe the program never sees (closed before it runs).
    os.write(_cfg["status_fd"], json.dumps(_layers).encode())
    os.close(_cfg["status_fd"])
    del (
        _setup,
        _namespaces,
        _seccomp,
        _seccomp_allowlist,
        _audit,
        _load_bindings,
        _libc,
        _layers,
        _pdeathsig,
    )
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
