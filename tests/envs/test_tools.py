"""skyrl-gym's Python tool runs through the project's sandbox in every environment built here: an
environment using the tool (tests/support/fake_envs.py:PythonToolEnv) answers programs as the
tool does, but a program no longer sees the trainer's environment variables, network or files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env
from marlhf.envs.runner import run_episodes
from marlhf.envs.tools import SandboxedPythonTool, sandbox_python_tools

FAKES = Path(__file__).resolve().parents[1] / "support" / "fake_envs.py"
SECRET = "print(__import__('os').environ.get('MARLHF_PROBE_SECRET'))"


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv("MARLHF_PROBE_SECRET", "s3cret")


def play(programs: list[str], timeout: float = 10.0) -> list[str]:
    """The environment's answer to each program (one row each), run by the runner."""
    factory = load_env(f"{FAKES}:PythonToolEnv", f'{{"timeout": {timeout}}}')
    rows = [{"prompt": "run it", "id": i} for i in range(len(programs))]
    episodes = run_episodes(
        factory,
        rows,
        lambda ids, _: [programs[i] for i in ids],
        EnvConfig(env="x", env_timeout_s=0),
    )
    return [e.turns[0].observations[0]["content"] for e in episodes]


def test_the_tool_group_is_replaced_in_every_env_built_here(secret):
    env = load_env(f"{FAKES}:PythonToolEnv").make({})
    assert [type(g) for g in env.tool_groups] == [SandboxedPythonTool]
    assert env.tool_to_toolgroup == {"python": "PythonCodeExecutorToolGroup"}
    assert env.tool_groups[0].timeout == 10.0


def test_programs_answer_as_the_tool_does_and_see_no_secrets(secret):
    out = play(["print(6 * 7)", "x = 1", "print(1/0)", SECRET])
    assert out[0] == "42" and out[1] == ""
    assert out[2].startswith("Error executing Python code: ") and "ZeroDivisionError" in out[2]
    assert out[3] == "None"  # the sandbox's environment is a minimal one


@pytest.mark.skipif(shutil.which("python") is None, reason="skyrl-gym's tool runs `python`")
def test_without_the_swap_the_tool_leaks_the_trainers_environment(secret):
    """The reference: skyrl-gym's own tool group, built directly, runs unsandboxed."""
    from tests.support.fake_envs import PythonToolEnv

    env = PythonToolEnv()
    assert env.step(SECRET)["observations"][0]["content"] == "s3cret"
    assert sandbox_python_tools(env) == 1
    assert env.step(SECRET)["observations"][0]["content"] == "None"


def test_network_and_writing_outside_are_blocked_and_time_is_limited(tmp_path):
    target = tmp_path / "planted.txt"
    out = play(
        [
            "import socket; socket.create_connection(('127.0.0.1', 9))",
            f"open({str(target)!r}, 'w').write('x')",
            "while True: pass",
        ],
        timeout=1.0,
    )
    assert out[0].startswith("Error executing Python code: ") and "blocked" in out[0]
    assert out[1].startswith("Error executing Python code: ") and not target.exists()
    assert out[2] == "Error executing Python code: Execution timed out after 1.0 seconds."
