"""``--reward_source reasoning-gym``: the task's own scorer (``score_answer``) of each response to a
reasoning-gym prompt (``--data_path reasoning-gym:NAME``, `marlhf.data.gym`; package
``reasoning-gym``: procedurally generated, seeded tasks, nothing downloaded).

A prompt's ``meta["reasoning_gym"]`` names its entry, ``{"task", "seed", "size", "index"}``: the
scorer regenerates that entry (the generator is deterministic) and scores the response's answer,
the text inside its last ``<answer>...</answer>`` tag, else the whole response stripped of
surrounding whitespace. Scores are in [0, 1]: 1 for the right answer, partial credit where the task
defines it. Declared in :mod:`marlhf.rewards.registry`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from typing import Any

from marlhf.rewards.registry import RewardContext
from marlhf.rewards.terms import RewardBatch, RewardTerm, check_values, refuse

GYM_KEY = "reasoning_gym"  # the key of a prompt's entry in its meta
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def require_gym(flag: str = "--reward_source reasoning-gym") -> None:
    """ValueError naming ``flag`` when reasoning-gym is not installed."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ValueError(f"{flag} needs the reasoning-gym package: pip install reasoning-gym")


@functools.lru_cache(maxsize=64)
def task_dataset(task: str, seed: int, size: int) -> Any:
    """reasoning-gym's dataset ``task`` of ``size`` entries generated from ``seed`` (cached)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=size, seed=seed)


def task_names() -> list[str]:
    """The tasks reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def response_answer(response: str) -> str:
    """The answer of a response: inside its last ``<answer>`` tag, else the stripped response.

    >>> response_answer("I count 4 legs. <answer> 4 </answer>"), response_answer(" 12\\n")
    ('4', '12')
    """
    found = _ANSWER_TAG.findall(response)
    return found[-1].strip() if found else response.strip()


def gym_entry(meta: dict) -> tuple[Any, dict]:
    """The dataset and the entry a prompt's ``meta`` names."""
    ref = meta[GYM_KEY]
    ds = task_dataset(ref["task"], int(ref["seed"]), int(ref["size"]))
    return ds, ds[int(ref["index"])]


def gym_score(meta: dict, response: str) -> float:
    """The task's score of ``response`` to the prompt whose ``meta`` names its entry."""
    ds, entry = gym_entry(meta)
    return ds.score_answer(response_answer(response), entry)


def is_gym_prompt(meta: dict | str) -> bool:
    """Whether a prompt's ``meta`` (a dict, or its JSON) names a reasoning-gym entry."""
    meta = json.loads(meta or "{}") if isinstance(meta, str) else meta
    return isinstance(meta.get(GYM_KEY), dict)


@dataclass(frozen=True)
class GymScore:
    """The task's score of each response (:func:`gym_score`); logs ``reward/reasoning-gym``."""

    errors: str = "raise"

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        raw: list[Any] = []
        name, not_gym = "--reward_source reasoning-gym", 0
        for b, (meta, response) in enumerate(zip(batch.metas, batch.completions, strict=True)):
            if not is_gym_prompt(meta):
                refuse(self.errors, f"{name}, {batch.row(b)}: not a reasoning-gym prompt")
                raw.append(0.0)
                not_gym += 1
                continue
            raw.append(gym_score(meta, response))
        values, _, n_errors = check_values(name, raw, batch, self.errors)
        return [RewardTerm("reasoning-gym", values, errors=n_errors + not_gym)]


def build_source(ctx: RewardContext) -> GymScore:
    """The ``reasoning-gym`` source of a run (``ctx.errors``: ``--reward_errors``)."""
    return GymScore(ctx.errors)
