"""The prompt rows of a multi-turn run (``--env``): SkyRL's dataset format, read from local files
or generated for the bundled trail task.

A row is a JSON object: ``prompt`` is the list of messages (``{"role", "content"}``; a plain string
is one user message), ``env_class`` may name the environment (``--env`` decides which one plays:
the column is not passed on), and the row's other columns (``reward_spec``, ``extra_info``, ...)
are the environment's ``extras`` (:func:`marlhf.envs.runner.episode_extras`). A ``--data_path``
entry is

- a ``.jsonl``, ``.json`` or ``.parquet`` file of such rows (SkyRL's own datasets are parquet), or
- ``marlhf-trail-{2,4,8}`` or ``marlhf-trail-{2,4,8}:N``: N games of the bundled trail task
  (:func:`marlhf.data.trail.rows`, default :data:`TRAIL_ROWS`, the ``train`` split, seed 0; the
  held-out games are the ``valid`` split).

Every row of every entry is a PPO prompt: the phase split between SFT, reward model and PPO
(``--data_split``) is for the single-turn datasets the three stages share, and an environment's
rows are RL prompts only. ``--max_samples`` caps the rows per entry.

>>> rows = load_env_rows(("marlhf-trail-2:3",))
>>> len(rows), rows[0]["prompt_id"], rows[0]["env_class"]
(3, 'trail2-train-000000', 'marlhf-trail-2')
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from marlhf.data import trail
from marlhf.data.readers import read_local
from marlhf.data.schema import DataError

ROW_SUFFIXES = (".jsonl", ".json", ".parquet")
TRAIL_SPEC = re.compile(r"^marlhf-trail-(\d+)(?::(\d+))?$")
TRAIL_ROWS = 1000  # games of a marlhf-trail-N entry without a count


def env_rows_problem(spec: str) -> str | None:
    """What is wrong with a ``--data_path`` entry of a multi-turn run (no file reading), or None."""
    m = TRAIL_SPEC.match(spec)
    if m:
        if int(m.group(1)) not in trail.TURNS:
            return f"--data_path {spec}: the trail task has {trail.TURNS} turns"
        if m.group(2) is not None and int(m.group(2)) < 1:
            return f"--data_path {spec}: the number of games must be >= 1"
        return None
    if not spec.endswith(ROW_SUFFIXES):
        return (
            f"--data_path {spec}: with --env, name prompt rows in SkyRL's format (a "
            f"{', '.join(ROW_SUFFIXES)} file) or marlhf-trail-{{2,4,8}}[:N]"
        )
    return None


def _prompt_text(row: Mapping, where: str) -> str:
    """The text of a row's prompt, for logs (its messages' contents, one a line)."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, Sequence) or not prompt:
        raise DataError(f'{where}: field "prompt" must be a list of messages or a string')
    texts = []
    for j, m in enumerate(prompt):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise DataError(f'{where}: field "prompt"[{j}] is no {{"role", "content"}} message')
        texts.append(m["content"])
    return "\n".join(texts)


def _plain(value):
    """A row's value as plain JSON-like Python (Parquet gives numpy arrays for lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def load_env_rows(
    data_path: Sequence[str], max_samples: int = 0, skip_bad_rows: bool = False
) -> list[dict]:
    """The prompt rows of ``data_path`` (the module doc), in order: each the row as read, with
    ``prompt_id`` (its ``id`` column, else ``<file>:<row>``) and ``prompt_text`` (its prompt's
    text, for logs) added. DataError naming the file and row for a row without a valid prompt."""
    out: list[dict] = []
    for spec in data_path:
        problem = env_rows_problem(spec)
        if problem:
            raise DataError(problem)
        m = TRAIL_SPEC.match(spec)
        if m:
            n = int(m.group(2) or TRAIL_ROWS)
            rows = trail.rows(int(m.group(1)), n, seed=0, split="train")
            labels = [f"{spec} row {i + 1}" for i in range(len(rows))]
        else:
            path = Path(spec)
            if not path.is_file():
                raise DataError(f"--data_path {spec}: no such file")
            raw = read_local(path, skip_bad_rows)
            if raw.bad and not skip_bad_rows:
                raise DataError(raw.bad[0])
            rows = [_plain(dict(r)) for r in raw.rows]
            labels = [raw.label(i) for i in range(len(rows))]
        if max_samples:
            rows, labels = rows[:max_samples], labels[:max_samples]
        for i, (row, where) in enumerate(zip(rows, labels, strict=True)):
            text = _prompt_text(row, where)
            pid = row.get("id")
            out.append(
                {
                    **row,
                    "prompt_id": str(pid) if pid is not None else f"{spec}:{i}",
                    "prompt_text": text,
                }
            )
    if not out:
        raise DataError(f"--data_path {' '.join(data_path)}: no prompt rows")
    return out


def episode_row(row: Mapping) -> dict:
    """A loaded row as the environment's prompt row: without the columns :func:`load_env_rows`
    added (``prompt_id``, ``prompt_text``)."""
    return {k: v for k, v in row.items() if k not in ("prompt_id", "prompt_text")}


def trail_gold(row: Mapping, messages: Sequence[Mapping]) -> float | None:
    """The gold score of a trail game's conversation (:func:`marlhf.data.trail.gold`), or None
    for a row of another task."""
    if not str(row.get("data_source", "")).startswith("marlhf-trail"):
        return None
    return trail.gold(trail.World.from_info(row["extra_info"]), messages)
