"""The registry of reward sources (``--reward_source``): what each source needs and how it is
built, and what the flag names. Plain data and the standard library, no torch: the configuration
reads it, and ``--help`` and a flag's error come before torch is imported.

A *reward source* is a :class:`RewardSource` registered with :func:`register_source`: its CLI name,
its help and what it needs (a reward model, test cases, a dataset column, a task's scorer), and
``build``, which makes it from the stage's :class:`RewardContext`; built, it is a callable
``source(batch) -> [RewardTerm, ...]`` (:mod:`marlhf.rewards.terms`). The step's sequence-level
reward of each row is the weighted sum of its terms (:func:`marlhf.rewards.terms.combine`).

Where a source lives:

- **a built-in source** is declared here (the entries at the end of this module), its ``build``
  (and its ``prompt_ok`` and ``check``) given as ``"package.module:function"``, imported when the
  source is first built: ``gold`` (:mod:`marlhf.rewards.gold`), ``rm``
  (:mod:`marlhf.rewards.model_score`), ``code`` (:mod:`marlhf.rewards.execution`), ``math``
  (:mod:`marlhf.rewards.math_answers`) and ``reasoning-gym`` (:mod:`marlhf.rewards.gym`);
- **a source of one's own** is one :class:`RewardSource` with its functions given directly, in a
  file ``--plugin`` names (:mod:`marlhf.plugins`), which may import torch at its top: it is imported
  only when named. A plain function of the prompts and completions needs no source:
  ``--reward_fn file.py:name`` (:mod:`marlhf.rewards.functions`), or a server, ``--reward_url``
  (:mod:`marlhf.rewards.remote`).

``--reward_source`` is one registered source or several joined by ``+`` (``rm+code``). ``none``
names no source (the reward is then ``--reward_fn`` and ``--reward_url`` alone); ``auto``, the
default, is ``rm``, or ``none`` when a function or a server is given, or ``reasoning-gym`` when every
``--data_path`` entry is a reasoning-gym task. A row's reward is the sum of the sources' rewards,
added in the order of registration (:func:`sum_order`), then each function's and the server's,
times its ``--reward_weights`` weight.

>>> resolve_reward_source("auto", custom=False, data_path=("synthetic-tldr",))
'rm'
>>> resolve_reward_source("auto", custom=True, data_path=("synthetic-tldr",))
'none'
>>> source_names("code+rm"), sum_order()
(('rm', 'code'), ('gold', 'rm', 'code', 'math', 'reasoning-gym'))
>>> REWARD_SOURCES["math"].build
'marlhf.rewards.math_answers:build_source'
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from marlhf.plugins import resolve_reference

__all__ = [
    "ERROR_MODES",
    "GYM_PREFIX",
    "REWARD_SOURCES",
    "RewardContext",
    "RewardError",
    "RewardSource",
    "build_sources",
    "check_reward_flags",
    "check_reward_source",
    "check_sources",
    "reads_reward_model",
    "register_source",
    "resolve_reward_source",
    "reward_source_help",
    "source_names",
    "sum_order",
    "unusable_prompts",
]

ERROR_MODES = ("raise", "zero")
GYM_PREFIX = "reasoning-gym:"

# a built source: a batch (marlhf.rewards.terms.RewardBatch) -> its terms (RewardTerm, ...)
RewardFn = Callable[[Any], Sequence[Any]]


class RewardError(RuntimeError):
    """A reward that cannot be trained on: a function that raised, a value that is not a finite
    number, an answer of the wrong length or type, a server that does not answer. The message
    names the reward (the function, the URL or the source), the row and the value."""


@dataclass(frozen=True)
class RewardContext:
    """What the stage gives the sources when it builds them (each takes what it needs).

    Fields:
        oracle: the synthetic task's gold scorer ``(prompt, response) -> float`` | None.
        rewarder: the sandboxed code rewarder (:class:`marlhf.rewards.code.CodeRewarder`) | None.
        normalize: normalise the reward model's scores with ``score_stats`` (``--normalize_reward``).
        score_stats: the reward model's saved score mean and std | None.
        errors: ``--reward_errors`` (``raise`` or ``zero``).
    """

    oracle: Callable[[str, str], float] | None = None
    rewarder: Any = None
    normalize: bool = False
    score_stats: Any = None
    errors: str = "raise"


@dataclass(frozen=True)
class RewardSource:
    """A registered source of ``--reward_source``. Its functions are given directly, or as
    ``"package.module:function"``, imported when first called (:func:`marlhf.plugins.resolve_reference`).

    Fields:
        name: its CLI name.
        help: one sentence for ``--help``.
        needs: what it reads, in words (``--help`` and messages).
        build: ``RewardContext -> RewardFn``; ValueError naming the flag when its needs are missing.
        reads_reward_model: it reads the reward model's scores (the stage loads one).
        prompt_ok: ``meta -> bool``, whether it can score a prompt | None: every prompt.
        drop_unusable: leave out the prompts it cannot score (with a warning) instead of refusing
            the data.
        check: ``() -> None``, raises ValueError naming the flag when something it needs is not
            installed | None.
    """

    name: str
    help: str
    needs: str
    build: Callable[[RewardContext], RewardFn] | str
    reads_reward_model: bool = False
    prompt_ok: Callable[[Any], bool] | str | None = None
    drop_unusable: bool = False
    check: Callable[[], None] | str | None = None

    def function(self, field_name: str) -> Callable | None:
        """Its ``build``, ``prompt_ok`` or ``check`` as a function (a reference imported)."""
        value = getattr(self, field_name)
        if isinstance(value, str):
            return resolve_reference(value, f"--reward_source {self.name}")
        return value


REWARD_SOURCES: dict[str, RewardSource] = {}


def register_source(source: RewardSource) -> RewardSource:
    """Register ``source`` under its CLI name (once; ``auto`` and ``none`` are no names)."""
    if source.name in REWARD_SOURCES or source.name in ("auto", "none"):
        raise ValueError(f"reward source {source.name!r} is registered twice")
    if "+" in source.name or not source.name.strip():
        raise ValueError(f"reward source {source.name!r}: a name without '+'")
    REWARD_SOURCES[source.name] = source
    return source


def sum_order() -> tuple[str, ...]:
    """The registered sources in the order their rewards add up: the order of registration."""
    return tuple(REWARD_SOURCES)


def source_names(source: str) -> tuple[str, ...]:
    """The registered sources a (resolved) ``--reward_source`` names, in :func:`sum_order`
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
                f"{', '.join(sum_order())} (join several with +), auto or none"
            )
    if len(set(names)) < len(names):
        raise ValueError(f"--reward_source {source} names a source twice")
    return tuple(n for n in sum_order() if n in names)


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
    parts = [f"`{n}`: {REWARD_SOURCES[n].help}" for n in sum_order()]
    return (
        "Where the reward comes from: "
        + "; ".join(parts)
        + ". Several add up: `rm+code`. `none`: --reward_fn / --reward_url alone. `auto` "
        "(default): `rm`, or `none` with --reward_fn or --reward_url, or `reasoning-gym` when "
        "every --data_path is reasoning-gym:NAME. A source of your own: register it in a "
        "--plugin file. docs/guide/rewards.md."
    )


def check_reward_flags(
    source: str,
    reward: Any,
    critic_free: str | None = None,
    reward_model_given: bool = True,
) -> None:
    """The flags of a resolved ``--reward_source`` with ``--reward_fn`` / ``--reward_url``
    (``reward``: the run's :class:`marlhf.rewards.config.RewardConfig`): some reward must be given,
    and a reward model path when a source reads one and no critic brings it (``critic_free``: the
    ``--advantage_estimator`` that trains no critic, else None; ``reward_model_given``:
    ``--reward_model_name_or_path`` or ``--critic_model_name_or_path`` is given). ValueError naming
    the flags."""
    if not source_names(source) and not reward.custom:
        raise ValueError(
            "--reward_source none gives no reward: pass --reward_fn or --reward_url, or name a "
            f"source ({', '.join(sum_order())})"
        )
    if critic_free is not None and reads_reward_model(source) and not reward_model_given:
        raise ValueError(
            f"--advantage_estimator {critic_free} trains no critic, but --reward_source {source} "
            "needs the reward model: pass --reward_model_name_or_path (or "
            "--critic_model_name_or_path, its default)"
        )


def check_sources(source: str) -> None:
    """Every source of (resolved) ``source`` has what it needs installed (ValueError naming the
    flag and the package else): call it before anything is loaded."""
    for name in source_names(source):
        check = REWARD_SOURCES[name].function("check")
        if check is not None:
            check()


def build_sources(names: Sequence[str], ctx: RewardContext) -> tuple[RewardFn, ...]:
    """The registered sources ``names`` built from ``ctx`` (ValueError when one's needs are
    missing)."""
    return tuple(REWARD_SOURCES[n].function("build")(ctx) for n in names)


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
        prompt_ok = src.function("prompt_ok")
        if prompt_ok is None:
            continue
        bad = [i for i, m in enumerate(metas) if not prompt_ok(m)]
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


# --------------------------------------------------------------------------------------------------
# the built-in sources, in the order their rewards add up (gold, rm, code: the stage's order of
# old), each implemented in the module its functions name


register_source(
    RewardSource(
        name="gold",
        help="the synthetic task's gold score (an oracle reward for experiments: synthetic-tldr "
        "and the long-horizon synthetic-facts-*/synthetic-verdict-* prompts only)",
        needs="a synthetic task's prompts",
        build="marlhf.rewards.gold:build_source",
    )
)
register_source(
    RewardSource(
        name="rm",
        help="the reward model's score of the response (stage 2's output: "
        "--reward_model_name_or_path, default --critic_model_name_or_path)",
        needs="a reward model",
        build="marlhf.rewards.model_score:build_source",
        reads_reward_model=True,
    )
)
register_source(
    RewardSource(
        name="code",
        help="execute the response's program against the prompt's test cases (APPS; "
        "--code_* flags; prompts without tests are left out)",
        needs="test cases (the APPS input_output column)",
        build="marlhf.rewards.execution:build_source",
        prompt_ok="marlhf.rewards.execution:has_prompt_tests",
        drop_unusable=True,
    )
)
register_source(
    RewardSource(
        name="math",
        help="1 when the response's answer equals the row's answer (or solution) column in "
        "value, checked by math-verify (pip install math-verify), else 0",
        needs="an answer or solution column",
        build="marlhf.rewards.math_answers:build_source",
        prompt_ok="marlhf.rewards.math_answers:has_reference",
        check="marlhf.rewards.math_answers:require_math_verify",
    )
)
register_source(
    RewardSource(
        name="reasoning-gym",
        help="the reasoning-gym task's own score of the response's answer (--data_path "
        "reasoning-gym:NAME; pip install reasoning-gym)",
        needs="reasoning-gym prompts (--data_path reasoning-gym:NAME)",
        build="marlhf.rewards.gym:build_source",
        prompt_ok="marlhf.rewards.gym:is_gym_prompt",
        check="marlhf.rewards.gym:require_gym",
    )
)
