"""skyrl-gym environments for the tests of ``marlhf.envs``, loaded as ``--env`` would load them
(``tests/support/fake_envs.py:Scripted`` or ``tests.support.fake_envs:Scripted``), in this process
or in the runner's worker processes.

``Scripted`` plays the row's ``extras["plan"]``, one entry per turn:

- ``{"obs": text, "reward": r, "done": d}``: answer with one user message ``text`` (none when
  ``text`` is None), reward ``r`` and ``done`` ``d``;
- ``{"raise": text}``: raise ``RuntimeError(text)``;
- ``{"sleep": s, ...}``: sleep ``s`` seconds first (recording the step's start as it starts, and
  its start and end times once it ends);
- ``{"hang": true}``: start a child process that sleeps, record both pids, and never return;
- ``{"return": value}``: return ``value`` as it is (a wrong type);

and after the plan, a user message ``more`` with no reward, never done. The observation is
``obs.format(action)``: a ``{}`` in ``obs`` shows the action (a literal brace is written doubled).
``env_config.log_dir`` (when set) receives ``<id>.closed`` on close, ``<id>.pids`` (the process's
and a hanging child's pids), ``<id>.started`` (a sleeping step's start, as it starts) and
``<id>.steps`` (its start and end times, once it ends), one line each.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.tools import PythonCodeExecutorToolGroup


class Scripted(BaseTextEnv):
    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.plan = list(extras.get("plan", []))
        self.id = str(extras.get("id", "row"))
        self.max_turns_seen = extras.get("max_turns")
        log_dir = env_config.get("log_dir") if env_config is not None else None
        self.log = Path(log_dir) if log_dir else None
        if extras.get("init_raise"):
            raise RuntimeError(extras["init_raise"])

    def _write(self, suffix: str, text: str) -> None:
        if self.log is not None:
            with open(self.log / f"{self.id}.{suffix}", "a") as f:
                f.write(text + "\n")

    def init(self, prompt):
        self._write("pids", str(os.getpid()))
        return prompt, {"id": self.id}

    def step(self, action):
        self.turns += 1
        entry = self.plan[self.turns - 1] if self.turns <= len(self.plan) else {"obs": "more"}
        if "raise" in entry:
            raise RuntimeError(entry["raise"])
        if "hang" in entry:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            self._write("pids", str(child.pid))
            while True:
                time.sleep(1)
        if "sleep" in entry:
            t0 = time.time()
            self._write("started", json.dumps(t0))
            time.sleep(entry["sleep"])
            self._write("steps", json.dumps([t0, time.time()]))
        if "return" in entry:
            return entry["return"]
        obs = entry.get("obs")
        observations = [] if obs is None else [{"role": "user", "content": obs.format(action)}]
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=entry.get("reward"),
            done=entry.get("done", False),
            metadata={},
        )

    def get_metrics(self):
        return {"steps": self.turns, "max_turns_seen": self.max_turns_seen}

    def close(self):
        self._write("closed", "1")


class BrokenClose(Scripted):
    def close(self):
        super().close()
        raise OSError("the database is gone")


class NotAnEnv:
    """A class that is no skyrl_gym Env."""

    def __init__(self, env_config=None, extras=None):
        pass


class PythonToolEnv(BaseTextEnv):
    """Runs each action as a Python program with skyrl-gym's Python tool and answers with its
    output; done after one turn."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        timeout = env_config.get("timeout", 10.0) if env_config is not None else 10.0
        self.init_tool_groups([PythonCodeExecutorToolGroup(timeout=timeout)])

    def step(self, action):
        out = self._execute_tool("PythonCodeExecutorToolGroup", "python", [action])
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": out}], reward=0.0, done=True, metadata={}
        )


def tally_reward(turn: int, n: int) -> float:
    """``Tally``'s reward of turn ``turn`` (1, 2, ...) for an action of ``n`` characters."""
    return (n % 5) / 4 + 0.1 * turn


class Tally(BaseTextEnv):
    """Deterministic, its reward depending on the action: turn t of an action of n characters
    answers ``turn t: n`` with reward ``tally_reward(t, n)``, done after the row's
    ``extras["turns"]`` turns."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.last = int((extras or {}).get("turns", 3))

    def init(self, prompt):
        return prompt, {}

    def note(self) -> str:
        return ""

    def step(self, action):
        self.turns += 1
        return BaseTextEnvStepOutput(
            observations=[
                {"role": "user", "content": f"turn {self.turns}: {len(action)}{self.note()}"}
            ],
            reward=tally_reward(self.turns, len(action)),
            done=self.turns >= self.last,
            metadata={},
        )


class Unreplayable(Tally):
    """``Tally`` whose observations carry a random number: replaying its steps answers otherwise."""

    def note(self) -> str:
        return f" ({random.random():.6f})"


class UnreplayableRow(Tally):
    """``Tally``, but ``Unreplayable`` on a row whose ``extras["random"]`` is true."""

    def __init__(self, env_config=None, extras=None):
        super().__init__(env_config, extras)
        self.random = bool((extras or {}).get("random"))

    def note(self) -> str:
        return f" ({random.random():.6f})" if self.random else ""
