"""The flags of PPO's own rewards: Python functions (``--reward_fn``), a reward server
(``--reward_url``) and what happens to a value that is not a finite number (``--reward_errors``).
The built-in sources are chosen by ``--reward_source`` (:mod:`marlhf.rewards.sources`)."""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass

from marlhf.config import flag
from marlhf.rewards.registry import ERROR_MODES


@dataclass
class RewardConfig:
    """Your own rewards: functions, a server, and how bad values are handled."""

    reward_fn: tuple[str, ...] = flag(
        (),
        "A Python reward function, path/to/file.py:name or module:name (repeat the "
        "flag for several): fn(prompts, completions, **columns) -> list of float or None, the "
        "rows' other dataset columns as keyword lists (TRL's convention; async def too). "
        "Added to --reward_source's reward; each function's mean is logged as "
        "reward/<name>. docs/guide/rewards.md.",
        repeat=True,
    )
    reward_weights: tuple[float, ...] = flag(
        (), "Weights of the --reward_fn functions, in order, then of --reward_url (default 1 each)."
    )
    reward_url: str | None = flag(
        None,
        'A reward server, http://host:port/path: POST {"prompts": [...], '
        '"completions": [...], <the rows\' other columns as lists>}, answer {"rewards": '
        "[...]} (logged as reward/server; scripts/reward_server.py is a reference server).",
    )
    reward_batch_size: int = flag(32, "Rows per request to --reward_url.")
    reward_concurrency: int = flag(4, "Requests to --reward_url in flight at once.")
    reward_timeout_s: float = flag(60.0, "Seconds a request to --reward_url may take.")
    reward_retries: int = flag(
        3,
        "Retries of a request to --reward_url that fails to connect, times out or "
        "gets 429/5xx (waiting 0.5 s, 1 s, 2 s, ...).",
    )
    reward_errors: str = flag(
        "raise",
        "A reward that raises or is not a finite number (a function's, the server's, "
        "math or reasoning-gym's): `raise` stops the run with one error line naming it, the "
        "row and the value; `zero` scores it 0, warns and counts it in reward/errors.",
        choices=ERROR_MODES,
    )

    @property
    def custom(self) -> bool:
        """Whether a function or a server gives reward (``--reward_fn``, ``--reward_url``)."""
        return bool(self.reward_fn) or self.reward_url is not None

    def __post_init__(self) -> None:
        for spec in self.reward_fn:
            where, sep, name = spec.rpartition(":")
            if not sep or not where or not name.isidentifier():
                raise ValueError(
                    f"--reward_fn takes path/to/file.py:name or module:name, got {spec!r}"
                )
        n = len(self.reward_fn) + (self.reward_url is not None)
        if self.reward_weights and len(self.reward_weights) != n:
            raise ValueError(
                f"--reward_weights gives {len(self.reward_weights)} weights for {n} rewards (one "
                "per --reward_fn, in order, then one for --reward_url)"
            )
        if any(not math.isfinite(w) for w in self.reward_weights):
            raise ValueError(f"--reward_weights must be finite, got {list(self.reward_weights)}")
        if self.reward_url is not None:
            url = urllib.parse.urlparse(self.reward_url)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(
                    f"--reward_url must be an http:// or https:// URL, got {self.reward_url!r}"
                )
        for name in ("reward_batch_size", "reward_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not self.reward_timeout_s > 0:
            raise ValueError(f"--reward_timeout_s must be > 0, got {self.reward_timeout_s}")
        if self.reward_retries < 0:
            raise ValueError(f"--reward_retries must be >= 0, got {self.reward_retries}")
        if self.reward_errors not in ERROR_MODES:
            raise ValueError(f"--reward_errors must be one of {ERROR_MODES}")
