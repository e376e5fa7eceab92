"""Tests for marlhf.rewards.sandbox.run: correct programs run, hostile ones are contained and scored as failures.

Every hostile program is checked for its *effect* (file absent, no connection, no secret in the
output, no stray process), not only for the reported status. Timeouts are short (1-2 s)."""

import doctest
import glob
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import marlhf
import marlhf.rewards.sandbox.run as sandbox_mod
from marlhf.rewards.sandbox.run import LAYERS, run_python

T = 2.0  # wall-clock limit for programs expected to finish quickly
PROJECT_FILE = os.path.join(os.path.dirname(os.path.dirname(marlhf.__file__)), "pyproject.toml")
KERNEL_LAYERS = (
    sys.platform == "linux"
    and os.geteuid() == 0
    and platform.machine() in ("x86_64", "aarch64", "arm64")
)


TOOLS = sandbox_mod.tools()
HAVE_BWRAP = TOOLS.bwrap is not None
HAVE_LIBSECCOMP = TOOLS.seccomp is not None


@pytest.fixture(autouse=True, params=["tools", "builtin"])
def sandbox_path(request, monkeypatch):
    """Every test runs on both paths: with bubblewrap and libseccomp where this machine has them
    ("tools"; the same as "builtin" where it has neither), and with the built-in layers only."""
    if request.param == "builtin":
        monkeypatch.setattr(sandbox_mod, "tools", lambda: sandbox_mod.Tools(None, None))
    return request.param


def _sandbox_processes() -> list[int]:
    """Pids of live processes started by the sandbox (their argv holds the work-dir prefix)."""
    pids = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                if b"marlhf-sandbox-" in f.read():
                    pids.append(int(path.split("/")[2]))
        except OSError:
            pass
    return pids


def test_docstring_examples():
    assert doctest.testmod(sandbox_mod).failed == 0


def test_stdin_stdout_program():
    r = run_python(
        "a, b = map(int, input().split())\nprint(a + b)\nprint('é')", "2 3\n", timeout_s=T
    )
    assert r.status == "ok" and r.returncode == 0
    assert r.stdout == "5\né\n"


def test_threads_and_common_stdlib_imports_work():
    src = (
        "import collections, heapq, bisect, itertools, math, functools, re, random, json, threading\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(math.comb(5, 2)))\n"
        "t.start(); t.join()\n"
        "print(out[0], sorted(collections.Counter('abca').items())[0])\n"
    )
    r = run_python(src, timeout_s=T)
    assert r.status == "ok", r.stderr
    assert r.stdout == "10 ('a', 2)\n"


def test_integers_beyond_the_int_str_digit_limit():
    # APPS programs read and print numbers of 9000+ digits, written for Pythons without the limit
    r = run_python("n = int(input())\nprint(n + 1)", "9" * 5000 + "\n", timeout_s=T)
    assert r.status == "ok" and r.stdout == "1" + "0" * 5000 + "\n"


def test_program_may_use_its_work_dir():
    src = "open('scratch.txt', 'w').write('hi')\nprint(open('scratch.txt').read())"
    r = run_python(src, timeout_s=T)
    assert (r.status, r.stdout) == ("ok", "hi\n")


def test_work_dir_is_removed():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "marlhf-sandbox-*")))
    r = run_python("import os; print(os.getcwd())", timeout_s=T)
    assert r.status == "ok"
    assert not os.path.exists(r.stdout.strip())
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "marlhf-sandbox-*")))
    assert after <= before


def test_compile_error_detected_without_running():
    r = run_python("def f(:\n    pass\nprint('ran')", timeout_s=T)
    assert r.status == "compile_error"
    assert r.returncode is None and r.stdout == ""
    assert "SyntaxError" in r.stderr


@pytest.mark.parametrize(
    "src, code",
    [("1 / 0", 1), ("import sys; sys.exit(3)", 3), ("raise SystemExit('bad')", 1)],
)
def test_runtime_errors(src, code):
    r = run_python(src, timeout_s=T)
    assert r.status == "runtime_error"
    assert r.returncode == code


def test_sys_exit_zero_is_ok():
    assert run_python("print(1)\nraise SystemExit(0)", timeout_s=T).status == "ok"


def test_infinite_loop_times_out_and_is_killed():
    t0 = time.monotonic()
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.status == "timeout"
    assert time.monotonic() - t0 < 2.5
    assert _sandbox_processes() == []


def test_sleeping_program_times_out():
    # no CPU use, so only the wall clock can stop it
    r = run_python("import time\ntime.sleep(60)", timeout_s=1.0)
    assert r.status == "timeout" and r.wall_s < 2.5


def test_cpu_limit_gives_timeout():
    r = run_python("while True:\n    pass", timeout_s=5.0, cpu_s=1)
    assert r.status == "timeout"
    assert r.wall_s < 4.0  # stopped by RLIMIT_CPU (SIGXCPU), not the wall clock


def test_fork_bomb_blocked_and_no_stray_processes():
    src = "import os\nwhile True:\n    os.fork()\n"
    r = run_python(src, timeout_s=T)
    assert r.status == "blocked"
    assert _sandbox_processes() == []


def test_fork_bomb_swallowing_errors_still_blocked():
    src = "import os\nfor _ in range(100):\n    try:\n        os.fork()\n    except Exception:\n        pass\nprint('done')"
    r = run_python(src, timeout_s=T)
    assert r.status == "blocked"
    assert _sandbox_processes() == []


def test_huge_allocation_is_memory():
    r = run_python("x = bytearray(8 * 1024**3)\nprint(len(x))", timeout_s=T, memory_mb=256)
    assert r.status == "memory"
    assert r.stdout == ""


def test_gradual_allocation_is_memory():
    r = run_python(
        "xs = []\nwhile True:\n    xs.append(bytearray(1 << 20))", timeout_s=T, memory_mb=128
    )
    assert r.status == "memory"


def test_write_outside_work_dir_blocked(tmp_path):
    target = tmp_path / "evil.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('pwned')", timeout_s=T)
    assert r.status == "blocked"
    assert not target.exists()


def test_delete_outside_work_dir_blocked(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    r = run_python(f"import os\nos.remove({str(victim)!r})", timeout_s=T)
    assert r.status == "blocked"
    assert victim.read_text() == "keep"


def _listening_server():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.3)
    return srv


def _saw_connection(srv) -> bool:
    try:
        conn, _ = srv.accept()
    except TimeoutError:
        return False
    conn.close()
    return True


def test_network_to_localhost_blocked():
    srv = _listening_server()
    try:
        port = srv.getsockname()[1]
        src = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')"
        r = run_python(src, timeout_s=T)
        assert r.status == "blocked"
        assert not _saw_connection(srv)
    finally:
        srv.close()


def test_environment_secret_not_visible(monkeypatch):
    monkeypatch.setenv("MARLHF_TEST_SECRET", "hunter2-secret")
    r = run_python("import os\nprint(sorted(os.environ.items()))", timeout_s=T)
    assert r.status == "ok"
    assert "hunter2-secret" not in r.stdout and "MARLHF_TEST_SECRET" not in r.stdout


def test_parent_environ_via_proc_not_readable(monkeypatch):
    monkeypatch.setenv("MARLHF_TEST_SECRET", "hunter2-secret")
    src = f"print(open('/proc/{os.getpid()}/environ', 'rb').read())"
    r = run_python(src, timeout_s=T)
    assert r.status == "blocked"
    assert "hunter2" not in r.stdout


def test_project_file_by_absolute_path_blocked():
    assert os.path.exists(PROJECT_FILE)
    r = run_python(f"print(open({PROJECT_FILE!r}).read())", timeout_s=T)
    assert r.status == "blocked"
    assert "ma-rlhf" not in r.stdout


def test_listing_project_dir_blocked():
    r = run_python(f"import os\nprint(os.listdir({os.path.dirname(PROJECT_FILE)!r}))", timeout_s=T)
    assert r.status == "blocked"
    assert "pyproject" not in r.stdout


@pytest.mark.parametrize(
    "src",
    [
        "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo spawned'], capture_output=True).stdout)",
        "import os\nos.system('echo spawned')",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo spawned'])",
    ],
    ids=["subprocess", "os.system", "execv"],
)
def test_spawning_shell_blocked(src):
    r = run_python(src, timeout_s=T)
    assert r.status == "blocked"
    assert "spawned" not in r.stdout
    assert _sandbox_processes() == []


def test_signal_to_parent_blocked():
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        r = run_python(f"import os, signal\nos.kill({os.getpid()}, signal.SIGUSR1)", timeout_s=T)
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert r.status == "blocked"
    assert got == []


def test_ctypes_blocked():
    r = run_python("import ctypes\nctypes.CDLL(None).getpid()", timeout_s=T)
    assert r.status == "blocked"


def test_printing_gigabytes_hits_output_limit():
    t0 = time.monotonic()
    src = "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.stdout.write(block)"
    r = run_python(src, timeout_s=T, max_output_bytes=1 << 16)
    assert r.status == "output_limit"
    assert len(r.stdout) <= 1 << 16
    assert time.monotonic() - t0 < T


def test_stderr_flood_counts_towards_output_limit():
    src = "import sys\nwhile True:\n    sys.stderr.write('e' * 65536)"
    r = run_python(src, timeout_s=T, max_output_bytes=1 << 16)
    assert r.status == "output_limit"


def test_invalid_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("pass", memory_mb=1)
    with pytest.raises(ValueError, match="layers"):
        run_python("pass", _skip_layers=("nope",))


# Defence in depth: with any single layer switched off, the others still contain each attack.
HOSTILE = {
    "fork": "import os\nfor _ in range(50):\n    os.fork()\nprint('forked')",
    "shell": "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo spawned'], capture_output=True).stdout)",
    "project": f"print(open({PROJECT_FILE!r}).read())",
}


@pytest.mark.skipif(
    not KERNEL_LAYERS, reason="namespaces/seccomp need root on x86-64 or aarch64 Linux"
)
@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_alone_is_not_load_bearing(layer, tmp_path):
    srv = _listening_server()
    try:
        port = srv.getsockname()[1]
        target = tmp_path / "evil.txt"
        progs = dict(HOSTILE)
        progs["write"] = f"open({str(target)!r}, 'w').write('pwned')"
        progs["net"] = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        for name, src in progs.items():
            r = run_python(src, timeout_s=T, _skip_layers=(layer,))
            assert r.status != "ok", (layer, name, r)
            assert (
                "forked" not in r.stdout and "spawned" not in r.stdout and "ma-rlhf" not in r.stdout
            )
        assert not target.exists()
        assert not _saw_connection(srv)
        assert _sandbox_processes() == []
    finally:
        srv.close()


# --- the trainer dies (SIGKILL) while a program runs ---------------------------------------------
_TRAINER = r"""
import sys
import marlhf.rewards.sandbox.run as sb
if sys.argv[1] == "builtin":
    sb.tools = lambda: sb.Tools(None, None)
prog = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open('ready', 'w').close()\n"
    "time.sleep(120)\n"
)
sb.run_python(prog, timeout_s=120.0)
"""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _descendants(root: int) -> list[int]:
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parent[int(entry)] = st[1]
    out = []
    for pid in parent:
        p = pid
        while p in parent and p not in (0, 1):
            p = parent[p]
            if p == root:
                out.append(pid)
                break
    return out


def _workdir_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    import re

    m = re.search(r"(/[^\x00\"]*?marlhf-sandbox-[^\x00\"/]+)", cmd)
    return m.group(1) if m else None


def test_program_dies_with_a_killed_trainer_and_its_dir_is_cleaned_at_next_start(sandbox_path):
    """A program that ignores SIGTERM and sleeps must not outlive a trainer killed with SIGKILL,
    and the work dir the trainer could not remove goes at the next start."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(marlhf.__file__)))
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, sandbox_path], env=env)
    sandboxed: list[int] = []
    workdir = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and workdir is None:
            for pid in _descendants(trainer.pid):
                w = _workdir_of(pid)
                if w and os.path.exists(os.path.join(w, "ready")):
                    workdir = w
            time.sleep(0.05)
        assert workdir is not None, "the sandboxed program never started"
        sandboxed = [p for p in _descendants(trainer.pid) if _workdir_of(p) == workdir]
        assert sandboxed
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in sandboxed):
            time.sleep(0.05)
        assert not any(_alive(p) for p in sandboxed), "the sandboxed program outlived the trainer"
        assert os.path.isdir(workdir)  # nobody was left to remove it
        # the next trainer's first sandboxed run removes it
        nxt = subprocess.run(
            [
                sys.executable,
                "-c",
                "import marlhf.rewards.sandbox.run as sb; print(sb.run_python('pass').status)",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert nxt.stdout.strip() == "ok", nxt.stderr
        assert not os.path.exists(workdir)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        for pid in sandboxed:  # on failure: leave no orphan behind
            if _alive(pid) and _workdir_of(pid) == workdir:
                os.kill(pid, signal.SIGKILL)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def test_stale_cleanup_keeps_dirs_of_live_owners_and_foreign_names(tmp_path):
    me = os.getpid()
    ns = os.stat("/proc/self/ns/pid").st_ino
    start = sandbox_mod._process_start_time(me)
    live = tmp_path / f"marlhf-sandbox-{ns}-{me}-{start}-abcd"
    dead = tmp_path / f"marlhf-sandbox-{ns}-{me}-{start + 1}-efgh"  # same pid, another start: dead
    other_ns = tmp_path / f"marlhf-sandbox-{ns + 1}-{me}-{start + 1}-ijkl"
    old_style = tmp_path / "marlhf-sandbox-mnop"
    for d in (live, dead, other_ns, old_style):
        d.mkdir()
        (d / "solution.py").write_text("pass")
    removed = sandbox_mod.clean_stale_workdirs(str(tmp_path))
    assert removed == [str(dead)]
    assert live.exists() and other_ns.exists() and old_style.exists() and not dead.exists()


def test_work_dir_is_named_after_its_owner():
    r = run_python("import os; print(os.getcwd())", timeout_s=T)
    name = os.path.basename(r.stdout.strip())
    ns, pid, start = name[len("marlhf-sandbox-") :].split("-")[:3]
    assert int(pid) == os.getpid()
    assert int(start) == sandbox_mod._process_start_time(os.getpid())
    assert int(ns) == os.stat("/proc/self/ns/pid").st_ino


# --- which layers are in place --------------------------------------------------------------------
def test_layers_are_reported(sandbox_path):
    r = run_python("print(1)", timeout_s=T)
    assert r.status == "ok"
    assert {"process", "rlimits", "audit"} <= set(r.layers)
    assert any(x.startswith("die-with-parent") for x in r.layers)
    if KERNEL_LAYERS:
        assert any(x.startswith("seccomp:") for x in r.layers)
        assert any(x.startswith("namespaces:") for x in r.layers)
    if sandbox_path == "builtin":
        assert "seccomp:libseccomp-allowlist" not in r.layers
        assert "namespaces:bwrap" not in r.layers
    else:
        assert ("namespaces:bwrap" in r.layers) == HAVE_BWRAP
        if KERNEL_LAYERS:
            assert ("seccomp:libseccomp-allowlist" in r.layers) == HAVE_LIBSECCOMP


def test_layers_are_logged_once(caplog, sandbox_path, monkeypatch):
    monkeypatch.setattr(sandbox_mod, "_layers_logged", set())
    with caplog.at_level("INFO", logger="marlhf.rewards.sandbox.run"):
        layers = sandbox_mod.sandbox_layers()
        run_python("pass", timeout_s=T)
    lines = [r.getMessage() for r in caplog.records if "sandbox layers" in r.getMessage()]
    assert lines == ["sandbox layers: " + ", ".join(layers)]


@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed or does not run")
def test_bwrap_pid_namespace_hides_other_processes(sandbox_path):
    if sandbox_path == "builtin":
        pytest.skip("bubblewrap path only")
    # the program is pid 2 of its own pid namespace (bwrap is pid 1), and kill(-1) reaches nothing
    r = run_python("import os\nprint(os.getpid())", timeout_s=T, _skip_layers=("audit",))
    assert (r.status, r.stdout) == ("ok", "2\n")


@pytest.mark.skipif(
    not (HAVE_LIBSECCOMP and KERNEL_LAYERS), reason="libseccomp's Python bindings are absent"
)
def test_allowlist_refuses_a_syscall_the_denylist_lets_through(sandbox_path):
    """getpriority(2) is harmless and on neither list of refusals: the allow-list filter refuses it
    (EPERM) because it is not on its list, the built-in deny-list filter lets it through."""
    src = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.getpriority(0, 0)\n"
        "print(r, ctypes.get_errno())\n"
    )
    r = run_python(src, timeout_s=T, _skip_layers=("audit",))
    assert r.status == "ok", r.stderr
    if sandbox_path == "builtin":
        assert r.stdout.split()[0] != "-1"
    else:
        assert r.stdout.split() == ["-1", "1"]  # EPERM


def test_bwrap_hides_a_project_that_holds_the_virtualenv(tmp_path, monkeypatch):
    # `make` puts .venv inside the repository: the project must still be hidden (covered by an
    # empty tmpfs), with only the interpreter's library bound back read-only over it
    proj = tmp_path / "proj"
    lib = proj / ".venv" / "lib" / "python3.11"
    lib.mkdir(parents=True)
    (proj / "pyproject.toml").write_text("secret")
    monkeypatch.setattr(sandbox_mod, "_stdlib_roots", lambda: [str(lib)])
    argv = sandbox_mod._bwrap_argv("bwrap", str(tmp_path / "work"), [str(proj)], None)
    i = argv.index("--tmpfs", argv.index("/proc") + 1)
    assert argv[i + 1] == str(proj)
    assert argv[i + 2 : i + 5] == ["--ro-bind", str(lib), str(lib)]
