"""The environment the multi-turn cost benchmarks play (``bench_multiturn.py``, ``bench_turn_step.py``):
it answers every action with one fixed observation, the trail task's ``my boss: call my cousin.``,
and ends the episode after ``env_config.turns`` turns (default 4), so that only the turns' own cost
is measured. ``env_config.step_s`` (default 0) makes every step take that many seconds (a tool call
or a remote service). The last turn's reward is the parity of its action text's CRC-32 (0 or 1, the
same in every process), so that a trainer's advantages are not all 0. Load it as
``benchmarks/fixed_turns.py:FixedTurns`` (or ``benchmarks.fixed_turns:FixedTurns`` with the
repository on the path)."""

from __future__ import annotations

import time
import zlib

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

OBSERVATION_TEXT = "my boss: call my cousin."
OBSERVATION = [{"role": "user", "content": OBSERVATION_TEXT}]


class FixedTurns(BaseTextEnv):
    """See the module doc; ``env_config``: a mapping (``turns``, ``step_s``)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        cfg = env_config or {}
        self.done_at = int(cfg.get("turns", 4))
        self.step_s = float(cfg.get("step_s", 0.0))

    def init(self, prompt):
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.step_s > 0:
            time.sleep(self.step_s)
        self.turns += 1
        done = self.turns >= self.done_at
        return BaseTextEnvStepOutput(
            observations=[] if done else list(OBSERVATION),
            reward=float(zlib.crc32(action.encode()) % 2) if done else 0.0,
            done=done,
            metadata={},
        )
