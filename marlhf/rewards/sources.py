"""The reward sources ``--reward_source`` names, and how a run's reward is put together from them
and from ``--reward_fn`` / ``--reward_url``.

``--reward_source`` is one registered source or several joined by ``+`` (``rm+code``); each is one
module that registers itself (:mod:`marlhf.rewards.registry`): ``gold``
(:mod:`marlhf.rewards.gold`), ``rm`` (:mod:`marlhf.rewards.model_score`), ``code``
(:mod:`marlhf.rewards.code`), ``math`` (:mod:`marlhf.rewards.math_answers`) and ``reasoning-gym``
(:mod:`marlhf.rewards.gym`). ``none`` names no source (the reward is then ``--reward_fn`` and
``--reward_url`` alone); ``auto``, the default, is ``rm``, or ``none`` when a function or a server
is given, or ``reasoning-gym`` when every ``--data_path`` entry is a reasoning-gym task.

A row's reward is the sum of the sources' rewards, added in the order of :data:`SUM_ORDER`, then
each function's and the server's, times its ``--reward_weights`` weight.

>>> resolve_reward_source("auto", custom=False, data_path=("synthetic-tldr",))
'rm'
>>> resolve_reward_source("auto", custom=True, data_path=("synthetic-tldr",))
'none'
>>> source_names("code+rm")
('rm', 'code')
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence

# importing each source's module registers it
from marlhf.rewards import code, gold, gym, math_answers, model_score  # noqa: F401
from marlhf.rewards.config import RewardConfig
from marlhf.rewards.functions import FunctionRewards, reward_functions
from marlhf.rewards.registry import REWARD_SOURCES, RewardContext, RewardFn
from marlhf.rewards.remote import RemoteReward

# the order in which the sources' rewards are added up (gold, rm, code: the stage's order of old)
SUM_ORDER = ("gold", "rm", "code", "math", "reasoning-gym")
GYM_PREFIX = "reasoning-gym:"


def source_names(source: str) -> tuple[str, ...]:
    """The registered sources a (resolved) ``--reward_source`` names, in :data:`SUM_ORDER`
    (``none``: none). ValueError naming the flag for an unknown name."""
    if source == "none":
        return ()
    names = [n.strip() for n in source.split("+")]
    for name in names:
        if name not in REWARD_SOURCES:
            close = difflib.get_close_matches(name, [*REWARD_SOURCES, "auto", "none"], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(
                f"--reward_source {source}: {name!r} is no reward source{hint}; the sources: "
                f"{', '.join(SUM_ORDER)} (join several with +), auto or none"
            )
    if len(set(names)) < len(names):
        raise ValueError(f"--reward_source {source} names a source twice")
    return tuple(n for n in SUM_ORDER if n in names)


def check_reward_source(source: str) -> None:
    """ValueError naming the flag unless ``source`` is ``auto``, ``none`` or sources joined by +."""
    if source != "auto":
        source_names(source)


def resolve_reward_source(source: str, custom: bool, data_path: Sequence[str]) -> str:
    """``--reward_source`` with ``auto`` resolved: ``none`` when ``custom`` (a ``--reward_fn`` or
    ``--reward_url`` is given), ``reasoning-gym`` when every ``data_path`` entry is a reasoning-gym
    task, else ``rm``."""
    if source != "auto":
        return source
    if custom:
        return "none"
    if data_path and all(p.startswith(GYM_PREFIX) for p in data_path):
        return "reasoning-gym"
    return "rm"


def reads_reward_model(source: str) -> bool:
    """Whether a resolved ``--reward_source`` reads the reward model (the stage loads one)."""
    return any(REWARD_SOURCES[n].reads_reward_model for n in source_names(source))


def reward_source_help() -> str:
    """``--reward_source``'s help: every registered source, what it needs, auto and none."""
    parts = [f"`{n}`: {REWARD_SOURCES[n].help}" for n in SUM_ORDER]
    return (
        "Where the reward comes from: "
        + "; ".join(parts)
        + ". Several add up: `rm+code`. `none`: --reward_fn / --reward_url alone. `auto` "
        "(default): `rm`, or `none` with --reward_fn or --reward_url, or `reasoning-gym` when "
        "every --data_path is reasoning-gym:NAME. docs/guide/rewards.md."
    )


def check_reward_flags(
    source: str,
    reward: RewardConfig,
    critic_free: str | None = None,
    reward_model_given: bool = True,
) -> None:
    """The flags of a resolved ``--reward_source`` with ``--reward_fn`` / ``--reward_url``: some
    reward must be given, and a reward model path when a source reads one and no critic brings it
    (``critic_free``: the ``--advantage_estimator`` that trains no critic, else None;
    ``reward_model_given``: ``--reward_model_name_or_path`` or ``--critic_model_name_or_path`` is
    given). ValueError naming the flags."""
    if not source_names(source) and not reward.custom:
        raise ValueError(
            "--reward_source none gives no reward: pass --reward_fn or --reward_url, or name a "
            f"source ({', '.join(SUM_ORDER)})"
        )
    if critic_free is not None and reads_reward_model(source) and not reward_model_given:
        raise ValueError(
            f"--advantage_estimator {critic_free} trains no critic, but --reward_source {source} "
            "needs the reward model: pass --reward_model_name_or_path (or "
            "--critic_model_name_or_path, its default)"
        )


def build_sources(names: Sequence[str], ctx: RewardContext) -> tuple[RewardFn, ...]:
    """The registered sources ``names`` built from ``ctx`` (ValueError when one's needs are
    missing)."""
    return tuple(REWARD_SOURCES[n].build(ctx) for n in names)


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


def check_sources(source: str) -> None:
    """Every source of (resolved) ``source`` has what it needs installed (ValueError naming the
    flag and the package else): call it before anything is loaded."""
    for name in source_names(source):
        if REWARD_SOURCES[name].check is not None:
            REWARD_SOURCES[name].check()


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


def unusable_prompts(
    source: str, metas: Sequence[dict | str], ids: Sequence[str] | None = None
) -> tuple[list[int], list[str]]:
    """The prompts the sources of ``source`` cannot score (``metas``: each prompt's meta, or its
    JSON; ``ids``: their prompt ids, for messages): (the rows to leave out, the messages of the
    sources that refuse the data instead, naming how many rows, the first and what it needs)."""
    drop: set[int] = set()
    refusals: list[str] = []
    for name in source_names(source):
        src = REWARD_SOURCES[name]
        if src.prompt_ok is None:
            continue
        bad = [i for i, m in enumerate(metas) if not src.prompt_ok(m)]
        if not bad:
            continue
        if src.drop_unusable:
            drop.update(bad)
        else:
            refusals.append(
                f"--reward_source {name} needs {src.needs}: {len(bad)} of {len(metas)} prompts "
                f"lack it (the first: {ids[bad[0]] if ids else f'prompt {bad[0]}'})"
            )
    return sorted(drop), refusals
