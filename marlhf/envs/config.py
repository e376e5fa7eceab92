"""The flags of a multi-turn run on an environment (``--env`` and what runs it).

``EnvConfig`` is one config part (:mod:`marlhf.cli` makes its fields flags). It imports nothing
heavy: the environment itself is loaded by :func:`marlhf.envs.loading.load_env` when a run starts,
and ``--env_config`` is read by :func:`marlhf.envs.loading.parse_env_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ENV_ERRORS = ("fail", "zero_reward")


@dataclass
class EnvConfig:
    """Multi-turn episodes on a skyrl-gym environment (``BaseTextEnv``)."""

    env: str | None = field(
        default=None,
        metadata={
            "help": "The environment of every prompt row: an id registered with skyrl_gym.register "
            "(skyrl-gym's own, e.g. gsm8k_multi_turn, or the bundled marlhf-trail-{2,4,8}), "
            "path/to/file.py:ClassName or module:ClassName (a skyrl_gym BaseTextEnv subclass). "
            "None: single-turn answers scored by the reward source."
        },
    )
    env_config: str | None = field(
        default=None,
        metadata={
            "help": "The environment's env_config (its constructor's first argument, as in SkyRL): "
            "a JSON object inline, or a .json/.yaml/.yml file holding one. Default: empty."
        },
    )
    max_turns: int = field(
        default=8,
        metadata={
            "help": "Policy turns per episode at most: an episode whose environment has not said "
            "done after this many ends there (counted in env/stopped_max_turns). Also passed to "
            "the environment in its extras as max_turns, as SkyRL does."
        },
    )
    max_total_seq_len: int = field(
        default=1024,
        metadata={
            "help": "Tokens of a whole conversation at most (first prompt, actions and "
            "observations): an episode that reaches it ends before its next turn."
        },
    )
    env_timeout_s: float = field(
        default=60.0,
        metadata={
            "help": "Seconds one init, step or close of an environment may take; a step that takes "
            "longer is stopped (its process is killed) and is an error of that row. With a "
            "timeout every row's environment lives in a process of its own; 0: no timeout, the "
            "environments run in the trainer's process (a hanging step hangs the run)."
        },
    )
    env_workers: int = field(
        default=1,
        metadata={
            "help": "Steps of different rows run at once: in that many threads (--env_timeout_s 0) "
            "or processes. 1: one after the other."
        },
    )
    env_overlap: int = field(
        default=1,
        metadata={
            "help": "Groups each round's playing rows are split into, to overlap the "
            "environments' steps with decoding: while the environments step one group's "
            "actions (from a thread of the trainer per group; --env_workers and --env_timeout_s "
            "apply to each group's calls), the policy samples the next group's. 1: no overlap "
            "(every row samples, then every row steps). Worth it when steps take about as long "
            "as sampling a turn (tools, code, a remote service); each group is a smaller "
            "decoding batch. The episodes do not depend on it with a backend that seeds each row "
            "(static, vllm).",
        },
    )
    env_errors: str = field(
        default="fail",
        metadata={
            "help": "An environment that raises, times out or returns the wrong types: `fail` "
            "stops the run with one error line naming the environment, the row and the error; "
            "`zero_reward` ends that row's episode there with reward 0 for the turn and counts "
            "it in env/errors.",
            "choices": ENV_ERRORS,
        },
    )

    def __post_init__(self) -> None:
        if self.env is not None:
            spec = self.env.strip()
            if not spec or spec != self.env:
                raise ValueError(f"--env must be an id or PATH:ClassName, got {self.env!r}")
            if ":" in spec:
                where, _, name = spec.rpartition(":")
                if not where or not name.isidentifier():
                    raise ValueError(
                        f"--env {spec}: write path/to/file.py:ClassName or module:ClassName "
                        "(a class name after the last colon)"
                    )
        if self.env_config is not None and self.env is None:
            raise ValueError("--env_config needs --env (the environment it configures)")
        if self.max_turns < 1:
            raise ValueError(f"--max_turns must be >= 1, got {self.max_turns}")
        if self.max_total_seq_len < 2:
            raise ValueError(f"--max_total_seq_len must be >= 2, got {self.max_total_seq_len}")
        if not math.isfinite(self.env_timeout_s) or self.env_timeout_s < 0:
            raise ValueError(
                f"--env_timeout_s must be >= 0 (0: no timeout), got {self.env_timeout_s}"
            )
        if self.env_workers < 1:
            raise ValueError(f"--env_workers must be >= 1, got {self.env_workers}")
        if self.env_overlap < 1:
            raise ValueError(f"--env_overlap must be >= 1, got {self.env_overlap}")
        if self.env_errors not in ENV_ERRORS:
            raise ValueError(f"--env_errors must be one of {ENV_ERRORS}, got {self.env_errors!r}")
