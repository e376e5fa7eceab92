"""Load two inference result files and align them prompt by prompt.

A result file is JSONL, one ``{"prompt_id", "prompt", "response", "reward", ...}`` object per line.
Pairs are matched by ``prompt_id`` when every row of both files has one, else by prompt text. Within a
file, either every row has a ``prompt_id`` or none has: one row without it is an error naming the file
and line (matching everything by text instead would hide it). When one file has ids and the other has
none, rows are matched by text and ``on_note`` is told. Every prompt must occur exactly once in each
file; otherwise :class:`PairingError` names both files and the offending prompts, because judging a
partial overlap would silently compare different prompt sets.

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

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlhf.data.readers import json_lines


class PairingError(ValueError):
    """The two result files cannot be aligned."""


def result_file_field(side: str) -> Any:
    """The config field of model ``side``'s result file (``side`` ``a``: ``--model_name_a``, also
    spelled ``--model_a`` and ``--model-name-a``), which the judge and the human evaluation share."""
    return field(
        metadata={
            "help": f"Result JSONL of model {side}.",
            "aliases": (f"--model_{side}", f"--model-name-{side}"),
        }
    )


@dataclass
class Pair:
    """One prompt with model a's and model b's responses; ``extra`` keeps a's other keys;
    ``line_a``/``line_b`` are the rows' line numbers in their files."""

    key: str
    prompt: str
    response_a: str
    response_b: str
    prompt_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    line_a: int | None = None
    line_b: int | None = None


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a result JSONL file; errors name the file and line."""
    rows = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as err:
        raise PairingError(f"{path}: cannot read result file ({err.strerror})") from None
    with fh:
        for lineno, row in json_lines(fh, path, PairingError):
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


def _has_ids(rows: list[dict[str, Any]], path: Any) -> bool:
    """Whether the rows of one file carry ``prompt_id``: all or none (else PairingError)."""
    with_id = [r for r in rows if "prompt_id" in r]
    if with_id and len(with_id) < len(rows):
        lacking = next(r for r in rows if "prompt_id" not in r)
        raise PairingError(
            f'{path} line {lacking["_line"]}: field "prompt_id" missing, while line '
            f"{with_id[0]['_line']} has one; give every row a prompt_id, or none (rows are then "
            "matched by prompt text)"
        )
    return bool(with_id)


def match_field(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    path_a: Any = "a",
    path_b: Any = "b",
    on_note: Callable[[str], None] | None = None,
) -> str:
    """``"prompt_id"`` if both files have ids, else ``"prompt"`` (see module doc)."""
    ids_a, ids_b = _has_ids(rows_a, path_a), _has_ids(rows_b, path_b)
    if ids_a and ids_b:
        return "prompt_id"
    if (ids_a or ids_b) and on_note is not None:
        has, lacks = (path_a, path_b) if ids_a else (path_b, path_a)
        on_note(f"note: {lacks} has no prompt_id ({has} has): pairs matched by prompt text")
    return "prompt"


def align_rows(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    path_a: Any = "a",
    path_b: Any = "b",
    on_note: Callable[[str], None] | None = None,
) -> list[Pair]:
    """Align already-loaded rows (order of ``rows_a``); see module doc."""
    by = match_field(rows_a, rows_b, path_a, path_b, on_note)
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
                line_a=ra["_line"],
                line_b=rb["_line"],
            )
        )
    return pairs


def align_results(
    path_a: str | os.PathLike[str],
    path_b: str | os.PathLike[str],
    on_note: Callable[[str], None] | None = None,
) -> list[Pair]:
    """Load and align two result files (pairs in file a's order)."""
    return align_rows(load_results(path_a), load_results(path_b), path_a, path_b, on_note)


def output_overwrites(output: str | os.PathLike[str], inputs: dict[str, Any]) -> str | None:
    """Why writing ``output`` or its ``.summary.json`` would overwrite one of ``inputs``
    (``{flag: path}``), or None. Both evaluation programs refuse such an ``--output``."""
    out = Path(output)
    for target in (out, out.with_name(out.name + ".summary.json")):
        for flag, given in inputs.items():
            if _same_file(target, Path(given)):
                return (
                    f"--output {output}: writing {target} would overwrite the input file "
                    f"{flag} {given}; choose another --output"
                )
    return None


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)
