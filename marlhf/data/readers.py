"""Reading a local dataset file into raw rows: JSON lines or one JSON document, CSV (``.csv``) or TSV
(``.tsv``) with a header row, UTF-8 only (a leading byte-order mark is ignored; a line with other
bytes, a surrogate, a value that is not a JSON object or a record with more or fewer cells than the
header is a bad row, named with its file and line, or skipped and counted with ``--skip_bad_rows``).
A CSV cell is text as written (no type guessing; an empty cell is a missing value, like JSON's
``null``); the fields that hold numbers (``margin``) read it (:attr:`RawRows.text_cells`). Parquet
goes through ``datasets``.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marlhf.data.schema import DataError

# Bytes that are not UTF-8, as decoded with errors="surrogateescape" (U+DC80..U+DCFF), and any
# surrogate (a JSON escape such as "\udcff" gives one): no tokenizer can encode those.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


_SURROGATE = re.compile("[\ud800-\udfff]")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

# the local files a --data_path entry (or a directory's split files) may be
LOCAL_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".parquet")
_DELIMITERS = {".csv": ",", ".tsv": "\t"}


@dataclass
class RawRows:
    """Rows of one file or hub split with a label for each (for error messages)."""

    rows: Iterable[dict]
    label: Callable[[int], str]  # 0-based row index -> "file line 17"
    columns: frozenset[str]
    bad: list[str]  # errors already found while reading (unparseable jsonl lines)
    text_cells: bool = False  # every value is text as written (CSV): a number is read from it


def _not_utf8(text: str) -> str | None:
    """Why ``text`` (decoded with errors="surrogateescape") is not UTF-8, or None when it is."""
    m = _UNDECODABLE.search(text)
    if m is None:
        return None
    return (
        f"not valid UTF-8 (byte 0x{ord(m.group()) - 0xDC00:02x} at character {m.start() + 1}); "
        "re-save the file as UTF-8"
    )


def _may_hold_surrogates(text: str) -> bool:
    """Whether JSON ``text`` can decode to a surrogate (cheap test before checking every row)."""
    return bool(_SURROGATE.search(text) or _SURROGATE_ESCAPE.search(text))


def _check_row(row: Any, may_hold_surrogates: bool = True) -> str | None:
    """Why a parsed JSON value is not a usable row (not an object, text that is not Unicode)."""
    if not isinstance(row, dict):
        return f"row must be a JSON object, got {type(row).__name__}"
    if not may_hold_surrogates:
        return None
    m = _SURROGATE.search(json.dumps(row, ensure_ascii=False))
    if m is not None:
        return (
            f"holds {ascii(m.group())}, which is not valid Unicode (a byte that is not UTF-8, or a "
            "lone surrogate escape); re-save the file as UTF-8"
        )
    return None


def _bad_row(msg: str, skip_bad_rows: bool, bad: list[str]) -> None:
    """A bad row, ``msg`` naming its file and line: an error, or with ``--skip_bad_rows`` one more
    of the ``bad`` rows skipped and counted."""
    if not skip_bad_rows:
        raise DataError(msg)
    bad.append(msg)


def json_lines(f: Iterable[str], path: Any, error: type[Exception] = DataError):
    """``(line number, value)`` of every non-blank line of the open JSON-lines file ``f`` (the
    file ``path``: for the error): a line that is not JSON raises ``error`` naming the file, line
    and column. A last line without its newline (one still being written) is read as any other.

    >>> list(json_lines(['{"a": 1}\\n', "\\n", "[2]\\n"], "f.jsonl"))
    [(1, {'a': 1}), (3, [2])]
    >>> list(json_lines(['{"a" 1}\\n'], "f.jsonl"))
    Traceback (most recent call last):
    ...
    marlhf.data.schema.DataError: f.jsonl line 1: not valid JSON at column 6 (Expecting ':' delimiter)
    """
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            msg = f"{path} line {lineno}: not valid JSON at column {e.colno} ({e.msg})"
            raise error(msg) from None
        yield lineno, value


def _parse_row(text: str) -> tuple[dict | None, str | None]:
    """One JSON object from ``text`` -> (row, None), or (None, why it is not one)."""
    why = _not_utf8(text)
    if why is not None:
        return None, why
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg})"
    why = _check_row(row, _may_hold_surrogates(text))
    return (None, why) if why else (row, None)


def _read_jsonl(path: Path, skip_bad_rows: bool) -> RawRows:
    """Parse and check every line here, so that an error names the line.

    "utf-8-sig" drops a leading byte-order mark; "surrogateescape" keeps bytes that are not UTF-8
    (as U+DC80..U+DCFF) so that their line, not the whole file, is the bad one.
    """
    parsed: list[dict] = []
    line_of: list[int] = []
    bad: list[str] = []
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row, why = _parse_row(line)
            if row is None:
                _bad_row(f"{path} line {lineno}: {why}", skip_bad_rows, bad)
                continue
            parsed.append(row)
            line_of.append(lineno)
    columns = frozenset(k for row in parsed for k in row)
    return RawRows(parsed, lambda i: f"{path} line {line_of[i]}", columns, bad)


def _read_json(path: Path, skip_bad_rows: bool) -> RawRows:
    """A ``.json`` file: a JSON array of row objects, or JSON lines (then read as ``.jsonl``)."""
    raw = path.read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    text = raw.decode("utf-8", errors="surrogateescape")
    if not text.lstrip().startswith("["):
        return _read_jsonl(path, skip_bad_rows)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path} line {e.lineno} column {e.colno}: not valid JSON ({e.msg})"
        ) from None
    parsed: list[dict] = []
    row_of: list[int] = []
    bad: list[str] = []
    check_text = _may_hold_surrogates(text)
    for i, row in enumerate(data):
        why = _check_row(row, check_text)
        if why is not None:
            _bad_row(f"{path} row {i + 1}: {why}", skip_bad_rows, bad)
            continue
        parsed.append(row)
        row_of.append(i + 1)
    columns = frozenset(k for row in parsed for k in row)
    return RawRows(parsed, lambda i: f"{path} row {row_of[i]}", columns, bad)


def _csv_records(path: Path, f) -> Iterable[tuple[int, list[str]]]:
    """(first line, cells) of every non-blank record; a quoted cell may span lines."""
    reader = csv.reader(f, delimiter=_DELIMITERS[path.suffix], strict=True)
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise DataError(
                f"{path} line {start}: not valid {path.suffix[1:].upper()} ({e})"
            ) from None
        if cells and any(c.strip() for c in cells):
            yield start, cells


def _read_csv(path: Path, skip_bad_rows: bool) -> RawRows:
    """A ``.csv`` / ``.tsv`` file: the header row names the columns; each record is a row whose
    empty cells are missing values. Read here (not through ``datasets``, whose type inference would
    turn ``"1"`` into ``1``), so that every cell is the text written and an error names its line."""
    kind = path.suffix[1:].upper()
    parsed: list[dict] = []
    line_of: list[int] = []
    bad: list[str] = []
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        records = _csv_records(path, f)
        first = next(records, None)
        if first is None:
            return RawRows([], lambda i: f"{path} line {line_of[i]}", frozenset(), [], True)
        lineno, header = first
        names = [h.strip() for h in header]
        why = _not_utf8("".join(names))
        dup = sorted({n for n in names if names.count(n) > 1})
        if why or dup or "" in names:
            what = why or (f"columns {dup} repeat" if dup else "a column has no name")
            raise DataError(f"{path} line {lineno}: the {kind} header: {what}")
        for lineno, cells in records:
            why = _not_utf8("".join(cells))
            if why is None and len(cells) != len(names):
                why = f"{len(cells)} cells, the header has {len(names)} ({', '.join(names)})"
            if why is not None:
                _bad_row(f"{path} line {lineno}: {why}", skip_bad_rows, bad)
                continue
            parsed.append({n: c for n, c in zip(names, cells, strict=True) if c != ""})
            line_of.append(lineno)
    return RawRows(parsed, lambda i: f"{path} line {line_of[i]}", frozenset(names), bad, True)


def read_local(path: Path, skip_bad_rows: bool = False) -> RawRows:
    """The rows of one local file (the module doc: JSON lines or one JSON document, CSV, TSV or
    Parquet), each labelled with its file and line; a bad row raises :class:`DataError` naming
    them (or is skipped and counted in ``bad`` with ``skip_bad_rows``)."""
    return _read_local(path, skip_bad_rows)


def _read_local(path: Path, skip_bad_rows: bool) -> RawRows:
    if path.suffix == ".jsonl":
        return _read_jsonl(path, skip_bad_rows)
    if path.suffix == ".json":
        return _read_json(path, skip_bad_rows)
    if path.suffix in _DELIMITERS:
        return _read_csv(path, skip_bad_rows)
    if path.suffix != ".parquet":
        raise DataError(
            f"{path}: unsupported file type (expected {', '.join(LOCAL_SUFFIXES[:-1])} or "
            f"{LOCAL_SUFFIXES[-1]})"
        )
    import datasets

    try:
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{path}: cannot be read as parquet: {e}") from e
    return RawRows(ds, lambda i: f"{path} row {i + 1}", frozenset(ds.column_names), [])
