"""Load two inference result files and align them prompt by prompt.

A result file is JSONL, one ``{"prompt_id", "prompt", "response", "reward", ...}`` object per line.
Pairs are matched by ``prompt_id`` when every row of both files has one, else by prompt text. Every
prompt must occur exactly once in each file; otherwise :class:`PairingError` names both files and the
offending prompts, because judging a partial overlap would silently compare different prompt sets.

>>> import json, tempfile, os
>>> d = tempfile.mkdtemp()
>>> for name, resp in (("a.jsonl", "x"), ("b.jsonl", "y")):
...     with open(os.path.join(d, name), "w") as fh:
...         _ = fh.write(json.dumps({"prompt": "p1", "response": resp}) + "\\n")
>>> [(p.prompt, p.response_a, p.response_b) for p in
...  align_results(os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl"))]
[('p1', 'x', 'y')]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


class PairingError(ValueError):
    """The two result files cannot be aligned."""


@dataclass
class Pair:
    """One prompt with model a's and model b's responses; ``extra`` keeps a's other keys."""

    key: str
    prompt: str
    response_a: str
    response_b: str
    prompt_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a result JSONL file; errors name the file and line."""
    rows = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as err:
        raise PairingError(f"{path}: cannot read result file ({err.strerror})") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise PairingError(f"{path} line {lineno}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise PairingError(f"{path} line {lineno}: expected a JSON object")
            for key in ("prompt", "response"):
                if not isinstance(row.get(key), str):
                    raise PairingError(
                        f'{path} line {lineno}: field "{key}" missing or not a string'
                    )
            row["_line"] = lineno
            rows.append(row)
    if not rows:
        raise PairingError(f"{path}: no results")
    return rows


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _index(rows: list[dict[str, Any]], by: str, path: Any) -> dict[str, dict[str, Any]]:
    index: dict[str, dict[str, Any]] = {}
    for row in rows:
        k = str(row[by])
        if k in index:
            raise PairingError(
                f"{path}: {by} {_short(k)!r} occurs twice (lines {index[k]['_line']} and "
                f"{row['_line']}); each prompt must appear once"
            )
        index[k] = row
    return index


def align_rows(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    path_a: Any = "a",
    path_b: Any = "b",
) -> list[Pair]:
    """Align already-loaded rows (order of ``rows_a``); see module doc."""
    by = "prompt_id" if all("prompt_id" in r for r in rows_a + rows_b) else "prompt"
    ia, ib = _index(rows_a, by, path_a), _index(rows_b, by, path_b)
    only_a = [k for k in ia if k not in ib]
    only_b = [k for k in ib if k not in ia]
    if only_a or only_b:
        parts = []
        for missing, have, lack in ((only_a, path_a, path_b), (only_b, path_b, path_a)):
            if missing:
                shown = ", ".join(repr(_short(k)) for k in missing[:3])
                more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
                parts.append(f"{len(missing)} {by}(s) in {have} missing from {lack}: {shown}{more}")
        raise PairingError(f"result files do not match (aligned by {by}): " + "; ".join(parts))
    pairs = []
    for k, ra in ia.items():
        rb = ib[k]
        if by == "prompt_id" and ra["prompt"] != rb["prompt"]:
            raise PairingError(
                f"prompt_id {k!r} has different prompt text in {path_a} (line {ra['_line']}) and "
                f"{path_b} (line {rb['_line']})"
            )
        extra = {
            x: v for x, v in ra.items() if x not in ("prompt", "response", "prompt_id", "_line")
        }
        pairs.append(
            Pair(
                key=k,
                prompt=ra["prompt"],
                response_a=ra["response"],
                response_b=rb["response"],
                prompt_id=str(ra["prompt_id"]) if "prompt_id" in ra else None,
                extra=extra,
            )
        )
    return pairs


def align_results(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str]) -> list[Pair]:
    """Load and align two result files (pairs in file a's order)."""
    return align_rows(load_results(path_a), load_results(path_b), path_a, path_b)
