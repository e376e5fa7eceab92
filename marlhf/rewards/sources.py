"""A run's reward, put together: the registered sources ``--reward_source`` names
(:mod:`marlhf.rewards.registry`, built by :func:`marlhf.rewards.registry.build_sources`), then the
user's ``--reward_fn`` functions (:mod:`marlhf.rewards.functions`) and ``--reward_url`` server
(:mod:`marlhf.rewards.remote`), each times its ``--reward_weights`` weight; the columns the functions
require, and the reward in words for the log.

>>> from marlhf.rewards.config import RewardConfig
>>> describe("rm", RewardConfig(reward_fn=("my.py:score",), reward_weights=(0.5,)))
'rm + my.py:score x 0.5'
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from marlhf.rewards.config import RewardConfig
from marlhf.rewards.functions import FunctionRewards, reward_functions
from marlhf.rewards.registry import source_names
from marlhf.rewards.remote import RemoteReward
from marlhf.rewards.terms import RewardFn


def custom_rewards(reward: RewardConfig) -> tuple[RewardFn, ...]:
    """The rewards of ``--reward_fn`` (loaded here: ValueError naming the flag when a file, module
    or function is not there) and ``--reward_url``, with their ``--reward_weights``, in that
    order."""
    out: list[RewardFn] = []
    k = len(reward.reward_fn)
    weights = list(reward.reward_weights)
    if reward.reward_fn:
        fns = reward_functions(reward.reward_fn, weights[:k])
        out.append(FunctionRewards(fns, reward.reward_errors))
    if reward.reward_url is not None:
        out.append(
            RemoteReward(
                reward.reward_url,
                weight=weights[k] if weights else 1.0,
                batch_size=reward.reward_batch_size,
                concurrency=reward.reward_concurrency,
                timeout_s=reward.reward_timeout_s,
                retries=reward.reward_retries,
                errors=reward.reward_errors,
            )
        )
    return tuple(out)


def check_columns(custom: Sequence[RewardFn], metas: Sequence[dict | str]) -> None:
    """Every ``--reward_fn`` function finds the columns it requires (its parameters without a
    default) among the prompts' columns (``metas``: their meta, or its JSON); ValueError naming
    the function, the columns it misses and those there are."""
    columns: dict[str, None] = {}
    for m in metas:
        m = json.loads(m or "{}") if isinstance(m, str) else m
        columns.update(dict.fromkeys(m.get("columns") or {}))
    for source in custom:
        for f in getattr(source, "functions", ()):
            missing = f.missing_columns(list(columns))
            if missing:
                raise ValueError(
                    f"--reward_fn {f.spec} takes the column(s) {', '.join(missing)}, which the PPO "
                    f"prompts do not have (their columns: {', '.join(columns) or 'none'}); give "
                    "the parameters a default, or use data with those columns (--data_columns "
                    "renames a local file's)"
                )


def describe(source: str, reward: RewardConfig) -> str:
    """The run's reward in words, for the log: ``rm + my_reward.py:score x 0.5 + the server at URL``."""
    weights = list(reward.reward_weights) or [1.0] * (len(reward.reward_fn) + 1)
    parts = list(source_names(source))
    parts += [
        f"{s}{f' x {w:g}' if w != 1 else ''}"
        for s, w in zip(reward.reward_fn, weights, strict=False)
    ]
    if reward.reward_url is not None:
        w = weights[len(reward.reward_fn)]
        parts.append(f"the server at {reward.reward_url}{f' x {w:g}' if w != 1 else ''}")
    return " + ".join(parts)
