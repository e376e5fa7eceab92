"""reasoning-gym tasks as a dataset: ``--data_path reasoning-gym:NAME`` (or ``reasoning-gym:NAME:SIZE``)
in every program (package ``reasoning-gym``: procedurally generated tasks with their own scorers,
seeded, nothing downloaded; ``pip install reasoning-gym``).

The train split is ``SIZE`` entries (default 1000) generated from seed 1, the eval split ``SIZE //
10`` entries (at least 20) from seed 2; each program takes its phase of them like any other data
(``--data_split``). An entry becomes an example with:

- the prompt ``"{question}\\nAnswer:"`` (with ``--apply_chat_template``, the question as the user's
  message);
- ``chosen`` = ``" {answer}"``, the task's answer (SFT learns to answer directly; entries without
  one have none and SFT leaves them out);
- ``rejected`` = the answer of the next entry that the task scores below 1 for this one (a wrong
  answer of the same form: the reward model learns to tell right from wrong), when there is one;
- ``meta["columns"]`` = ``{"answer", "metadata"}`` (what a ``--reward_fn`` function gets) and
  ``meta["reasoning_gym"]`` = the entry's task, seed, size and index: the PPO reward
  ``--reward_source reasoning-gym`` (:mod:`marlhf.rewards.gym`) regenerates the entry and scores
  the response with the task's ``score_answer``.

Several tasks are several entries: ``--data_path reasoning-gym:leg_counting
reasoning-gym:basic_arithmetic`` (a comma separates ``--data_path`` entries too).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json

from marlhf.data.report import SourceCounts
from marlhf.data.schema import DataError, Example
from marlhf.rewards.gym import GYM_KEY, require_gym, task_dataset, task_names

PREFIX = "reasoning-gym:"
SEEDS = {"train": 1, "eval": 2}
DEFAULT_SIZE = 1000
MIN_EVAL = 20
# Bump when what an entry becomes changes (part of the tokenised-data cache key, with the
# package's version).
GYM_FORMAT = 1


def is_gym_spec(spec: str) -> bool:
    """Whether a ``--data_path`` entry names a reasoning-gym task."""
    return spec.startswith(PREFIX)


def parse_gym_spec(spec: str) -> tuple[str, int]:
    """``(task, train size)`` of ``reasoning-gym:NAME[:SIZE]`` (DataError naming the flag)."""
    task, _, size = spec[len(PREFIX) :].partition(":")
    if not task:
        raise DataError(f"--data_path {spec}: name a task, reasoning-gym:NAME (e.g. leg_counting)")
    if not size:
        return task, DEFAULT_SIZE
    if not size.isdigit() or int(size) < 1:
        raise DataError(
            f"--data_path {spec}: the size after the task's name must be a positive integer"
        )
    return task, int(size)


def split_size(size: int, split: str) -> int:
    """Entries of ``split``: ``size`` for train, a tenth of it (at least 20) for eval."""
    return size if split == "train" else max(size // 10, MIN_EVAL)


def gym_problem(spec: str) -> str | None:
    """What is wrong with a ``reasoning-gym:`` entry (no package, no such task, a bad size), or
    None."""
    try:
        task, _ = parse_gym_spec(spec)
        require_gym(f"--data_path {spec}")
    except ValueError as e:
        return str(e)
    names = task_names()
    if task not in names:
        close = difflib.get_close_matches(task, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return (
            f"--data_path {spec}: reasoning-gym has no task {task!r}{hint} ({len(names)} tasks, "
            "e.g. leg_counting, basic_arithmetic, chain_sum: reasoning_gym.factory.DATASETS)"
        )
    return None


def fingerprint(spec: str) -> dict:
    """What identifies a task's examples for the tokenised-data cache: the entry, the package's
    version and :data:`GYM_FORMAT`."""
    try:
        version = importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        version = "missing"
    return {"spec": spec, "generator": f"reasoning-gym {version} format {GYM_FORMAT}"}


def _wrong_answer(ds, i: int, n: int) -> str | None:
    """The answer of the next entry after ``i`` that the task scores below 1 for entry ``i``."""
    entry = ds[i]
    for k in range(1, min(n, 8)):
        other = ds[(i + k) % n].get("answer")
        if other is None or str(other) == str(entry.get("answer")):
            continue
        if ds.score_answer(str(other), entry) < 1.0:
            return str(other)
    return None


def gym_examples(
    spec: str, split: str, max_samples: int = 0, counts: SourceCounts | None = None
) -> list[Example]:
    """The examples of a ``reasoning-gym:`` entry's ``split`` (``"train"`` or ``"eval"``), in
    generation order, at most ``max_samples`` (0: all); ``counts`` receives the rows made."""
    problem = gym_problem(spec)
    if problem:
        raise DataError(problem)
    task, size = parse_gym_spec(spec)
    n, seed = split_size(size, split), SEEDS[split]
    ds = task_dataset(task, seed, n)
    take = min(n, max_samples) if max_samples else n
    out = []
    for i in range(take):
        entry = ds[i]
        question = str(entry["question"])
        answer = entry.get("answer")
        answer = None if answer is None else str(answer)
        wrong = _wrong_answer(ds, i, n) if answer is not None else None
        metadata = json.loads(json.dumps(entry.get("metadata", {}), default=str))
        out.append(
            Example(
                prompt=f"{question.rstrip()}\nAnswer:",
                chosen=None if answer is None else f" {answer}",
                rejected=None if wrong is None else f" {wrong}",
                margin=None,
                prompt_id=f"reasoning-gym/{task}/{split}/{i}",
                meta={
                    "messages": [{"role": "user", "content": question}],
                    "columns": {"answer": answer, "metadata": metadata},
                    GYM_KEY: {"task": task, "seed": seed, "size": n, "index": i},
                },
            )
        )
    if counts is not None:
        counts.files.append(f"reasoning-gym {task} (seed {seed}, {n} entries)")
        counts.rows_read += n
        counts.in_split += n
        counts.examples += len(out)
        counts.capped = take < n
    return out
