"""The episode runner against scripted environments (tests/support/fake_envs.py) and a fake policy:
turns and rewards as scripted, errors under both policies, wrong return types, a done that never
comes, timeouts that stop the step's process, close always called, and threads or processes giving
what one-after-the-other gives."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env
from marlhf.envs.runner import EnvError, check_step, episode_metrics, run_episodes
from marlhf.stages.exits import error_line, raised_on_purpose

FAKES = str(Path(__file__).resolve().parents[1] / "support" / "fake_envs.py")


def rows_of(plans: list[list[dict]], **extra) -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": f"q{i}"}], "id": f"r{i}", "plan": p, **extra}
        for i, p in enumerate(plans)
    ]


def act(rows: list[int], conversations: list[list[dict]]) -> list[str]:
    """Row ``i``'s ``k``-th action is ``a{i}.{k}``."""
    return [
        f"a{i}.{sum(m['role'] == 'assistant' for m in c) + 1}"
        for i, c in zip(rows, conversations, strict=True)
    ]


def run(plans, tmp_path, cls="Scripted", **cfg):
    factory = load_env(f"{FAKES}:{cls}", json.dumps({"log_dir": str(tmp_path)}))
    cfg = EnvConfig(env="x", **{"env_timeout_s": 0.0, **cfg})
    return run_episodes(factory, rows_of(plans), act, cfg), factory


def closed(tmp_path: Path) -> list[str]:
    return sorted(p.stem for p in tmp_path.glob("*.closed"))


def test_turns_rewards_and_stops_follow_the_script(tmp_path):
    plans = [
        [{"obs": "o1 {}", "reward": 0.5}, {"obs": None, "reward": 2, "done": True}],
        [{"obs": "p1"}, {"obs": "p2", "reward": -1.0}, {"obs": "p3"}],  # never done
        [{"obs": "x", "done": True}],
    ]
    episodes, factory = run(plans, tmp_path, max_turns=3)
    a, b, c = episodes
    assert [t.action for t in a.turns] == ["a0.1", "a0.2"]
    assert a.rewards == [0.5, 2.0] and a.stop == "done" and a.done and not a.truncated
    assert a.messages == [
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "a0.1"},
        {"role": "user", "content": "o1 a0.1"},
        {"role": "assistant", "content": "a0.2"},
    ]
    assert b.rewards == [0.0, -1.0, 0.0] and b.stop == "max_turns" and b.truncated
    assert [t.reward for t in b.turns] == [None, -1.0, None]
    assert c.rewards == [0.0] and c.stop == "done"
    # every environment closed once, its metrics read, and max_turns passed in its extras
    assert closed(tmp_path) == ["r0", "r1", "r2"]
    assert [e.metrics for e in episodes] == [
        {"steps": 2, "max_turns_seen": 3},
        {"steps": 3, "max_turns_seen": 3},
        {"steps": 1, "max_turns_seen": 3},
    ]
    m = episode_metrics(episodes, factory)
    assert m["env/turns"] == 2.0 and m["env/errors"] == 0.0
    assert m["env/return"] == pytest.approx((2.5 - 1.0 + 0.0) / 3)
    assert m["env/done"] == pytest.approx(2 / 3) and m["env/stopped_max_turns"] == pytest.approx(
        1 / 3
    )
    assert m["env/steps"] == 2.0  # the class's aggregate_metrics: the mean of the numbers


def test_a_done_that_never_comes_stops_at_max_turns(tmp_path):
    episodes, _ = run([[]], tmp_path, max_turns=5)
    assert len(episodes[0].turns) == 5 and episodes[0].stop == "max_turns"
    assert closed(tmp_path) == ["r0"]


def test_an_exception_fails_the_run_with_one_line_naming_env_row_and_error(tmp_path):
    plans = [[{"obs": "o"}] * 3, [{"obs": "o"}, {"raise": "the tool broke\nbadly"}], [{"obs": "o"}]]
    with pytest.raises(EnvError) as info:
        run(plans, tmp_path, max_turns=3)
    line = error_line(info.value)
    assert (
        line
        == "error: --env Scripted: row 1, turn 2: step raised RuntimeError: the tool broke badly"
    )
    assert raised_on_purpose(info.value)  # one error line, no traceback, from the stages' handler
    assert closed(tmp_path) == ["r0", "r1", "r2"]  # every environment closed before the error


def test_zero_reward_ends_the_row_counts_the_error_and_keeps_the_others(tmp_path):
    plans = [
        [{"obs": "o", "reward": 0.25}, {"raise": "boom"}, {"obs": "never"}],
        [{"obs": "o", "reward": 1.0, "done": True}],
    ]
    episodes, factory = run(plans, tmp_path, env_errors="zero_reward", max_turns=3)
    bad, good = episodes
    assert bad.stop == "error" and bad.rewards == [0.25, 0.0] and len(bad.turns) == 2
    assert bad.error == "--env Scripted: row 0, turn 2: step raised RuntimeError: boom"
    assert good.stop == "done" and good.rewards == [1.0] and good.error is None
    assert episode_metrics(episodes, factory)["env/errors"] == 1.0
    assert closed(tmp_path) == ["r0", "r1"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("not a dict", "returned 'not a dict' (str); it must be a dict"),
        ({"observations": [], "reward": 1.0}, "returned a dict without done"),
        ({"observations": "hi", "reward": 1.0, "done": True}, "returned observations 'hi' (str)"),
        (
            {"observations": [{"role": "user"}], "reward": 1.0, "done": True},
            "returned observations[0].content None (NoneType)",
        ),
        ({"observations": [], "reward": "1", "done": True}, "returned reward '1' (str)"),
        ({"observations": [], "reward": float("nan"), "done": True}, "returned reward nan"),
        ({"observations": [], "reward": 1.0, "done": "yes"}, "returned done 'yes' (str)"),
        ({"observations": [], "reward": 1.0, "done": 1}, "returned done 1 (int)"),
        ({"observations": [], "reward": 1, "done": True, "metadata": 3}, "returned metadata 3"),
        (
            {"observations": [], "reward": 1, "done": True, "postprocessed_action": "x"},
            "postprocessed_action",
        ),
    ],
)
def test_wrong_return_types_are_errors_naming_env_row_field_and_value(tmp_path, value, says):
    with pytest.raises(EnvError) as info:
        run([[{"obs": "o"}], [{"obs": "o"}, {"return": value}]], tmp_path, max_turns=3)
    assert str(info.value).startswith("--env Scripted: row 1, turn 2: step ")
    assert says in str(info.value)


def test_check_step_accepts_what_skyrl_envs_return():
    import numpy as np

    turn = check_step(
        {"observations": [], "reward": np.float32(0.5), "done": np.bool_(True), "metadata": None}
    )
    assert (turn.reward, turn.done, turn.metadata) == (0.5, True, {})
    assert check_step({"observations": [], "reward": None, "done": False}).reward is None


def test_init_errors_and_a_failing_close(tmp_path):
    rows = rows_of([[{"obs": "o", "done": True}], [{"obs": "o", "done": True}]])
    rows[1]["init_raise"] = "no database"
    factory = load_env(f"{FAKES}:Scripted", json.dumps({"log_dir": str(tmp_path)}))
    for timeout in (0.0, 30.0):  # in this process, and in worker processes
        cfg = EnvConfig(env="x", env_timeout_s=timeout, env_errors="zero_reward")
        episodes = run_episodes(factory, rows, act, cfg, row_names=["prompt 7", "prompt 8"])
        assert episodes[1].stop == "error" and episodes[1].turns == []
        assert (
            episodes[1].error == "--env Scripted: prompt 8: init raised RuntimeError: no database"
        )
        assert episodes[1].messages == [{"role": "user", "content": "q1"}]
        assert episodes[0].stop == "done" and episodes[0].error is None
    factory = load_env(f"{FAKES}:BrokenClose", json.dumps({"log_dir": str(tmp_path / "b")}))
    (tmp_path / "b").mkdir()
    with pytest.raises(
        EnvError, match=r"row 0, turn 1: close raised OSError: the database is gone"
    ):
        run_episodes(factory, rows[:1], act, EnvConfig(env="x", env_timeout_s=0))


def test_max_total_seq_len_ends_a_row_before_its_next_turn(tmp_path):
    factory = load_env(f"{FAKES}:Scripted")
    rows = rows_of([[{"obs": "o"}] * 9, [{"obs": "o"}] * 9])

    def measure(row: int, messages: list[dict]) -> int:  # 10 "tokens" a message, row 1 twice
        return 10 * len(messages) * (2 if row == 1 else 1)

    cfg = EnvConfig(env="x", env_timeout_s=0, max_total_seq_len=50, max_turns=9)
    episodes = run_episodes(factory, rows, act, cfg, measure=measure)
    # row 0: 1 + 2k messages after k turns, stops once 10 * (1 + 2k) >= 50: after 2 turns
    assert [len(e.turns) for e in episodes] == [2, 1]
    assert [e.stop for e in episodes] == ["length", "length"] and episodes[0].truncated


def _plans_with_sleeps(n: int) -> list[list[dict]]:
    return [
        [{"obs": f"o{i}.{k}", "reward": float(i * 10 + k), "sleep": 0.2, "done": k == i % 3 + 1}
         for k in range(1, 4)]
        for i in range(n)
    ]  # fmt: skip


def _summary(episodes):
    return [(e.stop, e.rewards, e.messages, e.metrics) for e in episodes]


def test_threads_and_processes_give_what_serial_gives_and_threads_overlap(tmp_path):
    plans = _plans_with_sleeps(4)
    (tmp_path / "serial").mkdir()
    (tmp_path / "threads").mkdir()
    (tmp_path / "procs").mkdir()
    serial, _ = run(plans, tmp_path / "serial", env_workers=1, max_turns=3)
    threads, _ = run(plans, tmp_path / "threads", env_workers=4, max_turns=3)
    procs, _ = run(plans, tmp_path / "procs", env_workers=3, env_timeout_s=30.0, max_turns=3)
    assert _summary(threads) == _summary(serial) == _summary(procs)
    assert [len(e.turns) for e in serial] == [1, 2, 3, 1]

    def intervals(d):
        return [tuple(json.loads(x)) for p in d.glob("*.steps") for x in p.read_text().splitlines()]

    def overlapping(iv):
        return any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(iv) for b0, b1 in iv[:i])

    assert overlapping(intervals(tmp_path / "threads"))
    assert not overlapping(intervals(tmp_path / "serial"))
    assert closed(tmp_path / "procs") == ["r0", "r1", "r2", "r3"]


def test_steps_overlap_with_decoding_and_the_episodes_do_not_change(tmp_path):
    """``--env_overlap 2``: rows 0-1 and 2-3 take turns. When the policy samples rows 2-3 for
    the first time, a step of rows 0-1 is under way (started, not ended), and the episodes,
    errors included, are those of sampling every row and then stepping every row."""
    plans = _plans_with_sleeps(4)
    plans[1][1] = {"raise": "a tool failed"}
    plans[3][0] = {"return": [1, 2]}
    for name in ("serial", "overlap2", "overlap3"):
        (tmp_path / name).mkdir()
    serial, _ = run(plans, tmp_path / "serial", max_turns=3, env_errors="zero_reward")
    log = tmp_path / "overlap2"
    seen: list[bool] = []

    def lines(suffix: str) -> int:
        return sum(len(p.read_text().splitlines()) for p in log.glob(f"r[01].{suffix}"))

    def decoding(rows, conversations):
        if rows[0] >= 2 and not seen:  # rows 2-3's first turn: is a step of rows 0-1 running?
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not seen:
                ended = lines("steps")
                if lines("started") > ended:
                    seen.append(True)
                time.sleep(0.005)
            seen.append(False)
        return act(rows, conversations)

    factory = load_env(f"{FAKES}:Scripted", json.dumps({"log_dir": str(log)}))
    cfg = EnvConfig(env="x", env_timeout_s=0, max_turns=3, env_errors="zero_reward", env_overlap=2)
    overlapped = run_episodes(factory, rows_of(plans), decoding, cfg)
    assert seen[0] is True
    three, _ = run(plans, tmp_path / "overlap3", max_turns=3, env_errors="zero_reward",
                   env_overlap=3, env_workers=2, env_timeout_s=30.0)  # fmt: skip
    assert _summary(overlapped) == _summary(serial) == _summary(three)
    assert [e.stop for e in serial] == ["done", "error", "done", "error"]
    assert closed(log) == closed(tmp_path / "overlap3") == ["r0", "r1", "r2", "r3"]


def test_an_error_under_overlap_fails_the_run_once_and_closes_every_environment(tmp_path):
    plans = _plans_with_sleeps(4)
    plans[2][0] = {"raise": "a tool failed"}
    with pytest.raises(
        EnvError, match=r"^--env .*: row 2, turn 1: step raised RuntimeError: a tool failed$"
    ):
        run(plans, tmp_path, max_turns=3, env_overlap=2)
    assert closed(tmp_path) == ["r0", "r1", "r2", "r3"]


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its parent to reap it counts as stopped
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("errors", ["zero_reward", "fail"])
def test_a_hanging_step_is_stopped_with_its_children(tmp_path, errors):
    plans = [[{"obs": "o"}, {"hang": True}], [{"obs": "o"}, {"obs": "p", "done": True}]]
    t0 = time.monotonic()
    if errors == "fail":
        with pytest.raises(
            EnvError, match=r"row 1, turn 2: step did not return within --env_timeout_s 1"
        ):
            run(plans[::-1], tmp_path, env_timeout_s=1.0, env_errors=errors, max_turns=3)
    else:
        episodes, factory = run(plans, tmp_path, env_timeout_s=1.0, env_errors=errors, max_turns=3)
        assert episodes[0].stop == "error" and "did not return within" in episodes[0].error
        assert episodes[0].rewards == [0.0, 0.0]
        assert episodes[1].stop == "done"
        assert episode_metrics(episodes, factory)["env/errors"] == 1.0
    # the timeout (1 s) plus a margin for starting the processes on a loaded machine
    assert time.monotonic() - t0 < 1.0 + 20.0
    hung = "r0" if errors == "zero_reward" else "r1"
    pids = [int(x) for x in (tmp_path / f"{hung}.pids").read_text().split()]
    assert len(pids) == 2  # the environment's process and the child its step started
    deadline = time.monotonic() + 5
    while not all(map(_dead, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(map(_dead, pids))
    other = "r1" if hung == "r0" else "r0"
    assert closed(tmp_path) == [other]  # a killed environment cannot close; the other one did


TRAINER = """
import json, sys
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env
from marlhf.envs.runner import run_episodes
factory = load_env(sys.argv[1], json.dumps({"log_dir": sys.argv[2]}))
rows = [{"prompt": "q", "id": "r0", "plan": [{"hang": True}]}]
run_episodes(factory, rows, lambda ids, c: ["a"] * len(ids), EnvConfig(env="x", env_timeout_s=600))
"""


@pytest.mark.slow
def test_environment_processes_die_with_a_killed_trainer(tmp_path):
    """kill -9 of the trainer while a step hangs: the fork server exits, and with it (through
    PR_SET_PDEATHSIG) the environment's process; the step's own child is in its process group."""
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, f"{FAKES}:Scripted", str(tmp_path)], env=env, cwd=root
    )
    pids_file = tmp_path / "r0.pids"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        not pids_file.exists() or len(pids_file.read_text().split()) < 2
    ):
        time.sleep(0.2)
    env_pid, child_pid = (int(x) for x in pids_file.read_text().split())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while not _dead(env_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _dead(env_pid)
    if not _dead(child_pid):  # not the environment's: the step's child, orphaned; stop it here
        os.kill(child_pid, signal.SIGKILL)
