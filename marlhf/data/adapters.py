"""Dataset adapters: raw rows of each supported dataset -> ``Example`` records.

An adapter knows its hub id, hub config and splits, recognises its columns in local files, and turns
one row into an ``Example`` with the original MA-RLHF / DeepSpeed-Chat prompt template:

============================  =========================================================================
``openai/summarize_from_feedback`` (config ``comparisons``; train / validation)
                              ``"POST\\nSubreddit: r/{subreddit}\\n{post}\\nTL;DR: "`` (``ARTICLE`` when the
                              row has an article instead of a post; subreddit line omitted when
                              missing); chosen = ``summaries[choice].text``.
``synthetic-tldr``            the bundled file, same schema; rows' ``split`` field: train / valid*.
``synthetic-facts-16|64|256``, the long-horizon tasks (``marlhf.data.long_tasks``), same schema,
``synthetic-verdict-16|64|256``  generated on first use into ``$MARLHF_HOME/synthetic``.
``Dahoas/full-hh-rlhf``,      columns prompt/response/chosen/rejected; prompt already
``Dahoas/rm-static``          ``"\\n\\nHuman: ...\\n\\nAssistant:"``; train / test.
``openai/webgpt_comparisons`` ``" Human: {question.full_text} Assistant:"``, answers ``" {answer}"`` (a
                              space after ``Assistant:``, as in DeepSpeed-Chat); higher score chosen,
                              a tie chooses answer_0 (or is skipped with ``--webgpt_skip_ties``);
                              citation marks ``[1]``, ``[2, 3]`` removed; train only -> 95/5 carve.
``codeparrot/apps``           APPS-paper prompt (question, starter code, call-based or stdin format);
                              chosen = first solution (None when there is none); ``meta`` holds the
                              ``input_output`` tests and ``fn_name``; no rejected; train / test.
plain local files             columns ``prompt`` (+ ``chosen``, ``rejected``, ``margin``).
============================  =========================================================================

Local paths (``.json``, ``.jsonl``, ``.parquet`` or a directory of them, optionally ``adapter:path``)
are matched to an adapter by their columns. A directory's files are assigned to splits by name
(``train*`` -> train; ``valid*``, ``validation*``, ``eval*``, ``dev*``, ``test*`` -> eval). A single
file whose rows carry a ``split`` field (the TL;DR schema) is divided by it; any other single file
is all train, carved 95/5 like WebGPT.

Bad rows raise ``DataError`` naming the file, the row (1-based line for jsonl) and the field; with
``skip_bad_rows`` they are skipped, counted and the count is logged. Local JSON files are parsed here,
not through ``datasets`` (whose type inference rewrites a column of mixed types, e.g. decodes
``"choice": "1"`` to ``1`` when another row has an integer), so every row is read as written. They
must be UTF-8 (a leading byte-order mark is ignored); a line with other bytes is a bad row.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marlhf.code_reward import parse_json
from marlhf.data.long_tasks import TASKS as LONG_TASKS
from marlhf.data.long_tasks import data_file as long_task_file
from marlhf.data.report import SourceCounts
from marlhf.data.schema import DataError, Example

log = logging.getLogger(__name__)

# Bump when a template below or what a row becomes changes (it is part of the tokenised-data cache
# key). 2: WebGPT answers start with a space; TL;DR "choice" must be an integer; identical pairs dropped.
TEMPLATES_VERSION = 2
BUNDLED_SYNTHETIC = Path(__file__).resolve().parent / "bundled" / "synthetic_tldr.jsonl"
EVAL_CARVE_SEED = 1234  # fixed: the 95/5 carve must not move with the training seed
EVAL_CARVE_FRACTION = 0.05
_CITATION = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")
# Bytes that are not UTF-8, as decoded with errors="surrogateescape" (U+DC80..U+DCFF), and any
# surrogate (a JSON escape such as "\udcff" gives one): no tokenizer can encode those.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SPLIT_NAMES = {
    "train": ("train",),
    "eval": ("validation", "valid", "eval", "dev", "test"),
}


# --- field helpers -------------------------------------------------------------------------------
def _get(row: dict, dotted: str, where: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            raise DataError(f'{where}: field "{dotted}" missing')
        cur = cur[part]
    return cur


def _text(row: dict, dotted: str, where: str) -> str:
    value = _get(row, dotted, where)
    if not isinstance(value, str):
        raise DataError(f'{where}: field "{dotted}" must be a string, got {type(value).__name__}')
    if not value.strip():
        raise DataError(f'{where}: field "{dotted}" is empty')
    return value


def _opt_text(row: dict, dotted: str, where: str) -> str | None:
    try:
        return _text(row, dotted, where)
    except DataError as e:
        if "missing" in str(e):
            return None
        raise


def _number(row: dict, key: str, where: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataError(f'{where}: field "{key}" must be a number, got {type(value).__name__}')
    return float(value)


def _hash_id(name: str, text: str) -> str:
    return f"{name}/{hashlib.sha1(text.encode('utf-8')).hexdigest()[:16]}"


# --- adapters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Adapter:
    """How to load one dataset and read its rows.

    ``splits`` maps our split ("train" / "eval") to the hub split name (None: carve eval from train).
    ``columns``: the columns that identify the schema in a local file.
    ``hub_files``: hub split name -> data file in the hub repository, read directly as JSON lines,
    for repositories whose loading script ``datasets`` no longer runs.
    """

    name: str
    hub_id: str | None
    hub_config: str | None
    splits: dict[str, str | None]
    columns: frozenset[str]
    convert: Callable[[dict, str, dict], Example | None]
    hub_files: dict[str, str] | None = None

    def to_example(self, row: dict, where: str, options: dict | None = None) -> Example | None:
        """One row -> ``Example`` (None: a row this adapter skips by design, e.g. a WebGPT tie)."""
        if not isinstance(row, dict):
            raise DataError(f"{where}: row must be a JSON object, got {type(row).__name__}")
        return self.convert(row, where, options or {})


def _tldr(name: str) -> Callable[[dict, str, dict], Example | None]:
    def convert(row: dict, where: str, options: dict) -> Example:
        info = _get(row, "info", where)
        if not isinstance(info, dict):
            raise DataError(f'{where}: field "info" must be an object')
        if info.get("post") is not None:
            kind, body = "POST", _text(row, "info.post", where)
        elif info.get("article") is not None:
            kind, body = "ARTICLE", _text(row, "info.article", where)
        else:
            raise DataError(f'{where}: field "info.post" missing')
        sub = info.get("subreddit")
        head = f"{kind}\nSubreddit: r/{sub}\n" if sub else f"{kind}\n"
        prompt = f"{head}{body}\nTL;DR: "
        summaries = _get(row, "summaries", where)
        if not isinstance(summaries, list) or len(summaries) != 2:
            raise DataError(f'{where}: field "summaries" must be a list of two summaries')
        texts = []
        for i, s in enumerate(summaries):
            t = s.get("text") if isinstance(s, dict) else None
            if t is None:
                raise DataError(f'{where}: field "summaries[{i}].text" missing')
            if not isinstance(t, str) or not t.strip():
                raise DataError(f'{where}: field "summaries[{i}].text" is empty or not a string')
            texts.append(t)
        choice = _get(row, "choice", where)
        # One rule whatever the reader: the JSON integer 0 or 1, as in OpenAI's files ("1", 1.0 and
        # true are refused rather than guessed at).
        if type(choice) is not int or choice not in (0, 1):
            raise DataError(
                f'{where}: field "choice" must be 0 or 1 (a JSON integer), got {choice!r} '
                f"({type(choice).__name__}); write it as a number"
            )
        pid = info.get("id")
        return Example(
            prompt=prompt,
            chosen=texts[choice],
            rejected=texts[1 - choice],
            margin=None,
            prompt_id=f"{name}/{pid}" if pid is not None else _hash_id(name, prompt),
            meta={"subreddit": sub} if sub else {},
        )

    return convert


def _hh(name: str) -> Callable[[dict, str, dict], Example]:
    def convert(row: dict, where: str, options: dict) -> Example:
        prompt = _text(row, "prompt", where)
        return Example(
            prompt=prompt,
            chosen=_text(row, "chosen", where),
            rejected=_text(row, "rejected", where),
            margin=None,
            prompt_id=_hash_id(name, prompt),
            meta={},
        )

    return convert


def _strip_citations(text: str) -> str:
    return _CITATION.sub("", text).strip()


def _webgpt(row: dict, where: str, options: dict) -> Example | None:
    question = _text(row, "question.full_text", where)
    a0, a1 = _text(row, "answer_0", where), _text(row, "answer_1", where)
    s0, s1 = _number(row, "score_0", where), _number(row, "score_1", where)
    if s0 is None or s1 is None:
        raise DataError(f'{where}: field "{"score_0" if s0 is None else "score_1"}" missing')
    if s0 == s1 and options.get("webgpt_skip_ties"):
        return None
    # Tie -> answer_0 is chosen (as the original did); --webgpt_skip_ties drops ties instead.
    chosen, rejected = (a0, a1) if s0 >= s1 else (a1, a0)
    chosen, rejected = _strip_citations(chosen), _strip_citations(rejected)
    if not chosen or not rejected:
        raise DataError(f"{where}: an answer is empty once citation marks are removed")
    # The prompt ends with "Assistant:"; the answer starts with a space (DeepSpeed-Chat's convention,
    # the same as HH's responses): the model would otherwise learn "Assistant:Paris".
    chosen, rejected = " " + chosen, " " + rejected
    prompt = f" Human: {question} Assistant:"
    qid = row["question"].get("id") if isinstance(row["question"], dict) else None
    return Example(
        prompt=prompt,
        chosen=chosen,
        rejected=rejected,
        margin=None,
        prompt_id=f"webgpt/{qid}" if qid else _hash_id("webgpt", prompt),
        meta={},
    )


def apps_prompt(question: str, starter_code: str | None, call_based: bool) -> str:
    """The APPS paper's prompt: question, optional starter code, the expected I/O format."""
    starter = f"{starter_code}\n" if starter_code and starter_code.strip() else ""
    fmt = "Use Call-Based format" if call_based else "Use Standard Input format"
    return f"\nQUESTION:\n{question}\n{starter}\n{fmt}\nANSWER:\n"


def _apps(row: dict, where: str, options: dict) -> Example:
    question = _text(row, "question", where)
    io_raw = row.get("input_output") or ""
    if not isinstance(io_raw, str):
        raise DataError(f'{where}: field "input_output" must be a JSON string')
    fn_name = None
    if io_raw.strip():
        try:
            io = parse_json(io_raw)  # APPS tests hold integers beyond json.loads' digit limit
        except json.JSONDecodeError as e:
            raise DataError(f'{where}: field "input_output" is not valid JSON ({e.msg})') from None
        fn_name = io.get("fn_name") if isinstance(io, dict) else None
    sol_raw = row.get("solutions") or ""
    if not isinstance(sol_raw, str):
        raise DataError(f'{where}: field "solutions" must be a JSON string')
    solution = None
    if sol_raw.strip():
        try:
            sols = json.loads(sol_raw)
        except json.JSONDecodeError as e:
            raise DataError(f'{where}: field "solutions" is not valid JSON ({e.msg})') from None
        if isinstance(sols, list) and sols and isinstance(sols[0], str) and sols[0].strip():
            solution = sols[0]
    starter = row.get("starter_code")
    prompt = apps_prompt(
        question, starter if isinstance(starter, str) else None, fn_name is not None
    )
    pid = row.get("problem_id")
    return Example(
        prompt=prompt,
        chosen=solution,
        rejected=None,
        margin=None,
        prompt_id=f"apps/{pid}" if pid is not None else _hash_id("apps", prompt),
        meta={"tests": io_raw, "fn_name": fn_name, "difficulty": row.get("difficulty")},
    )


def _plain(row: dict, where: str, options: dict) -> Example:
    prompt = _text(row, "prompt", where)
    cols = options.get("columns", frozenset())
    chosen = _text(row, "chosen", where) if "chosen" in cols else None
    rejected = _text(row, "rejected", where) if "rejected" in cols else None
    margin = _number(row, "margin", where)
    if margin is not None and not math.isfinite(margin):
        raise DataError(f'{where}: field "margin" must be finite, got {margin}')
    pid = row.get("id")
    return Example(
        prompt=prompt,
        chosen=chosen,
        rejected=rejected,
        margin=margin,
        prompt_id=f"local/{pid}" if pid is not None else _hash_id("local", prompt),
        meta={},
    )


_TLDR_COLS = frozenset({"info", "summaries", "choice"})
ADAPTERS: dict[str, Adapter] = {
    a.name: a
    for a in (
        Adapter(
            "openai/summarize_from_feedback",
            "openai/summarize_from_feedback",
            "comparisons",
            {"train": "train", "eval": "validation"},
            _TLDR_COLS,
            _tldr("tldr"),
        ),
        Adapter(
            "synthetic-tldr",
            None,
            None,
            {"train": "train", "eval": "valid"},
            _TLDR_COLS,
            _tldr("synthetic-tldr"),
        ),
        # the long-horizon synthetic tasks (marlhf.data.long_tasks): generated on first use
        *(
            Adapter(name, None, None, {"train": "train", "eval": "valid"}, _TLDR_COLS, _tldr(name))
            for name in LONG_TASKS
        ),
        Adapter(
            "Dahoas/full-hh-rlhf",
            "Dahoas/full-hh-rlhf",
            None,
            {"train": "train", "eval": "test"},
            frozenset({"prompt", "response", "chosen", "rejected"}),
            _hh("hh"),
        ),
        Adapter(
            "Dahoas/rm-static",
            "Dahoas/rm-static",
            None,
            {"train": "train", "eval": "test"},
            frozenset({"prompt", "response", "chosen", "rejected"}),
            _hh("rm-static"),
        ),
        Adapter(
            "openai/webgpt_comparisons",
            "openai/webgpt_comparisons",
            None,
            {"train": "train", "eval": None},
            frozenset({"question", "answer_0", "answer_1", "score_0", "score_1"}),
            _webgpt,
        ),
        Adapter(
            "codeparrot/apps",
            "codeparrot/apps",
            None,
            {"train": "train", "eval": "test"},
            frozenset({"question", "solutions", "input_output"}),
            _apps,
            # the repository's apps.py is a loading script; its data are these two files
            hub_files={"train": "train.jsonl", "test": "test.jsonl"},
        ),
        Adapter(
            "plain", None, None, {"train": "train", "eval": None}, frozenset({"prompt"}), _plain
        ),
    )
}
# Short names accepted in ``adapter:path`` and on the command line.
ALIASES = {
    "tldr": "openai/summarize_from_feedback",
    "summarize": "openai/summarize_from_feedback",
    "hh": "Dahoas/full-hh-rlhf",
    "hh-rlhf": "Dahoas/full-hh-rlhf",
    "rm-static": "Dahoas/rm-static",
    "webgpt": "openai/webgpt_comparisons",
    "apps": "codeparrot/apps",
}
# Column detection order for local files: most specific schema first.
_DETECT = (
    "openai/summarize_from_feedback",
    "openai/webgpt_comparisons",
    "codeparrot/apps",
    "Dahoas/rm-static",
    "plain",
)


def get_adapter(name: str) -> Adapter:
    """The adapter registered under ``name`` (or an alias); ValueError listing the known ones."""
    name = ALIASES.get(name, name)
    if name not in ADAPTERS:
        known = sorted(ADAPTERS) + sorted(ALIASES)
        raise ValueError(
            f"--data_path: {name!r} is neither a local path nor a known dataset or adapter; "
            f"known: {', '.join(known)}"
        )
    return ADAPTERS[name]


def known_schemas() -> str:
    """The column sets a local file is recognised by, each with its adapters, for messages."""
    by_columns: dict[frozenset[str], list[str]] = {}
    for a in ADAPTERS.values():
        by_columns.setdefault(a.columns, []).append(a.name)
    parts = []
    for cols, names in by_columns.items():
        shown = names if len(names) <= 3 else [*names[:2], f"{len(names) - 2} more"]
        extra = " (+ chosen, rejected, margin)" if cols == ADAPTERS["plain"].columns else ""
        parts.append(f"{'/'.join(sorted(cols))}{extra}: {', '.join(shown)}")
    return "; ".join(parts)


def schema_help(cols: Iterable[str], source: str) -> str:
    """Why no schema matches a file's columns ``cols``, the known schemas and the two ways out."""
    return (
        f"{source}: no known dataset schema in its columns {sorted(cols)}. Known schemas (columns: "
        f"adapters): {known_schemas()}. Map your columns onto one with --data_columns (e.g. "
        "--data_columns prompt=query,chosen=response), or force an adapter with 'adapter:path' "
        f"(adapters and aliases: {', '.join(sorted(ADAPTERS) + sorted(ALIASES))})"
    )


def detect_adapter(columns: Iterable[str], source: str) -> Adapter:
    """The adapter whose schema matches ``columns`` (a local file's columns)."""
    cols = frozenset(columns)
    for name in _DETECT:
        if ADAPTERS[name].columns <= cols:
            return ADAPTERS[name]
    raise DataError(schema_help(cols, source))


def peek_columns(path: Path, max_rows: int = 200) -> frozenset[str] | None:
    """The columns of the first rows of a local data file, or of a directory's first train file
    (None: no file to read, or rows that do not parse: the stage reports those by line)."""
    if path.is_dir():
        files = _split_files(path, "train")
        if not files:
            return None
        path = files[0]
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return frozenset(pq.read_schema(path).names)
        if path.suffix == ".json" and path.read_text(errors="replace").lstrip().startswith("["):
            rows = json.loads(path.read_text())[:max_rows]
        else:
            with open(path, encoding="utf-8-sig", errors="replace") as f:
                lines = [ln for ln in (next(f, "") for _ in range(max_rows)) if ln.strip()]
            rows = [json.loads(ln) for ln in lines]
    except (OSError, ValueError, ImportError):
        return None
    return frozenset(k for r in rows if isinstance(r, dict) for k in r)


def columns_problem(spec: str, mapping: dict[str, str] | None = None) -> str | None:
    """Why a local ``--data_path`` entry's columns (renamed by ``mapping``, ``{theirs: ours}``)
    fit no schema (or not the adapter it forces), listing the schemas; None when they fit or
    cannot be read here."""
    adapter, local = parse_spec(spec)
    if local is None:
        return None
    cols = peek_columns(Path(local))
    if not cols:
        return None
    cols = frozenset((mapping or {}).get(c, c) for c in cols)
    if adapter is None:
        if any(ADAPTERS[name].columns <= cols for name in _DETECT):
            return None
        return f"--data_path {schema_help(cols, spec)}"
    if adapter.columns <= cols:
        return None
    missing = ", ".join(sorted(adapter.columns - cols))
    return (
        f"--data_path {spec}: the {adapter.name} adapter needs the columns {missing}, not in "
        f"{sorted(cols)}; map them with --data_columns (e.g. --data_columns prompt=query)"
    )


def rename_columns(rows: list[dict], mapping: dict[str, str]) -> list[dict]:
    """``rows`` with their columns renamed by ``mapping`` (``{their name: ours}``, as
    ``--data_columns`` gives it); rows without those columns are left as they are."""
    if not mapping:
        return rows
    out = []
    for row in rows:
        if isinstance(row, dict) and any(k in row for k in mapping):
            row = {mapping.get(k, k): v for k, v in row.items()}
        out.append(row)
    return out


# --- reading rows --------------------------------------------------------------------------------
@dataclass
class RawRows:
    """Rows of one file or hub split with a label for each (for error messages)."""

    rows: Iterable[dict]
    label: Callable[[int], str]  # 0-based row index -> "file line 17"
    columns: frozenset[str]
    bad: list[str]  # errors already found while reading (unparseable jsonl lines)


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
                msg = f"{path} line {lineno}: {why}"
                if not skip_bad_rows:
                    raise DataError(msg)
                bad.append(msg)
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
            msg = f"{path} row {i + 1}: {why}"
            if not skip_bad_rows:
                raise DataError(msg)
            bad.append(msg)
            continue
        parsed.append(row)
        row_of.append(i + 1)
    columns = frozenset(k for row in parsed for k in row)
    return RawRows(parsed, lambda i: f"{path} row {row_of[i]}", columns, bad)


def _read_local(path: Path, skip_bad_rows: bool) -> RawRows:
    if path.suffix == ".jsonl":
        return _read_jsonl(path, skip_bad_rows)
    if path.suffix == ".json":
        return _read_json(path, skip_bad_rows)
    if path.suffix != ".parquet":
        raise DataError(f"{path}: unsupported file type (expected .json, .jsonl or .parquet)")
    import datasets

    try:
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{path}: cannot be read as parquet: {e}") from e
    return RawRows(ds, lambda i: f"{path} row {i + 1}", frozenset(ds.column_names), [])


def _split_files(directory: Path, split: str) -> list[Path]:
    files = sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix in (".json", ".jsonl", ".parquet")
    )
    return [p for p in files if p.name.lower().startswith(_SPLIT_NAMES[split])]


def carve(n: int, split: str) -> np.ndarray:
    """Deterministic 95/5 train/eval carve of ``n`` rows for datasets with only a train split."""
    perm = np.random.RandomState(EVAL_CARVE_SEED).permutation(n)
    n_eval = _n_eval(n)
    return np.sort(perm[:n_eval] if split == "eval" else perm[n_eval:])


def _n_eval(n: int) -> int:
    return int(round(n * EVAL_CARVE_FRACTION))


def carve_min_rows() -> int:
    """The fewest rows whose 95/5 carve gives the eval split one row (11: round() halves to even)."""
    n = 1
    while _n_eval(n) == 0:
        n += 1
    return n


def parse_spec(spec: str) -> tuple[Adapter | None, str | None]:
    """``data_path`` entry -> (forced or registered adapter, local path or None for hub/bundled)."""
    if ":" in spec and not Path(spec).exists():
        head, rest = spec.split(":", 1)
        if ALIASES.get(head, head) in ADAPTERS:
            return get_adapter(head), rest
    if Path(spec).exists():
        return None, spec
    return get_adapter(spec), None


def _convert_rows(
    adapter: Adapter | None,
    raw: RawRows,
    source: str,
    keep: np.ndarray | None,
    skip_bad_rows: bool,
    options: dict,
    max_samples: int,
    split_filter: Callable[[dict], bool] | None = None,
    counts: SourceCounts | None = None,
) -> tuple[list[Example], int]:
    """The examples of ``raw``'s rows in the split (``keep`` / ``split_filter``); ``counts`` (when
    given) adds the rows of the split, the bad and by-design skips and the examples."""
    counts = counts if counts is not None else SourceCounts(source)
    n_bad = len(raw.bad)
    for msg in raw.bad:
        log.debug("skipped: %s", msg)
    out: list[Example] = []
    if adapter is None and len(raw.rows) > 0:  # no rows: no schema to tell, nothing to convert
        adapter = detect_adapter(raw.columns, source)
    opts = dict(options, columns=raw.columns)
    wanted = None if keep is None else set(keep.tolist())
    for i, row in enumerate(raw.rows):
        if wanted is not None and i not in wanted:
            continue
        if split_filter is not None and not split_filter(row):
            continue
        counts.in_split += 1
        try:
            ex = adapter.to_example(row, raw.label(i), opts)
        except DataError as e:
            if not skip_bad_rows:
                raise
            n_bad += 1
            log.debug("skipped: %s", e)
            continue
        if ex is None:
            counts.by_design += 1
            continue
        out.append(ex)
        if max_samples and len(out) >= max_samples:
            counts.capped = True
            break
    counts.bad += n_bad
    counts.examples += len(out)
    if n_bad:
        log.warning("%s: skipped %d bad rows", source, n_bad)
    return out, n_bad


def _row_split(row: dict) -> str | None:
    value = row.get("split") if isinstance(row, dict) else None
    if not isinstance(value, str):
        return None
    if value.startswith("train"):
        return "train"
    if value.startswith(_SPLIT_NAMES["eval"]):
        return "eval"
    return None


def bundled_file(adapter_name: str) -> Path | None:
    """The file shipped with the package for a synthetic task (``synthetic-tldr``,
    ``synthetic-facts-*``, ``synthetic-verdict-*``); None for the hub datasets."""
    if adapter_name == "synthetic-tldr":
        return BUNDLED_SYNTHETIC
    if adapter_name in LONG_TASKS:
        return long_task_file(adapter_name)
    return None


def load_examples(
    spec: str,
    split: str,
    *,
    skip_bad_rows: bool = False,
    max_samples: int = 0,
    webgpt_skip_ties: bool = False,
    counts: SourceCounts | None = None,
    columns: dict[str, str] | None = None,
) -> tuple[list[Example], int]:
    """All ``Example``s of one ``data_path`` entry's ``split`` ("train" or "eval"), in file order,
    and the number of bad rows skipped (always 0 unless ``skip_bad_rows``). ``counts``, when given,
    receives the files read and how many rows each step kept (see ``marlhf.data.report``).
    ``columns`` (``{their name: ours}``, ``--data_columns``) renames a local file's columns first."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    counts = counts if counts is not None else SourceCounts(spec)
    opts = {"webgpt_skip_ties": webgpt_skip_ties, "rename": dict(columns or {})}
    adapter, local = parse_spec(spec)
    if local is None and adapter is not None:
        bundled = bundled_file(adapter.name)
        local = None if bundled is None else str(bundled)
    if local is None:
        return _load_hub(adapter, split, skip_bad_rows, max_samples, opts, counts)
    path = Path(local)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    files, carve_split = [path], None
    if path.is_dir():
        if not _split_files(path, "train"):
            raise DataError(f"{path}: no train files (names starting with 'train')")
        # Only train files: carve a deterministic 95/5 train/eval split from them (like WebGPT).
        carve_split = not _split_files(path, "eval")
        files = _split_files(path, "train" if carve_split else split)
    return _load_files(adapter, files, split, carve_split, skip_bad_rows, max_samples, opts, counts)


def _load_files(
    adapter: Adapter | None,
    files: list[Path],
    split: str,
    carve_split: bool | None,
    skip_bad_rows: bool,
    max_samples: int,
    options: dict,
    counts: SourceCounts,
) -> tuple[list[Example], int]:
    """``carve_split``: True carve 95/5, False take all rows, None decide from the rows (single file)."""
    examples: list[Example] = []
    n_bad = 0
    for f in files:
        raw = _read_local(f, skip_bad_rows)
        if options.get("rename"):
            rows = rename_columns(list(raw.rows), options["rename"])
            names = frozenset(options["rename"].get(c, c) for c in raw.columns)
            raw = RawRows(rows, raw.label, names, raw.bad)
        counts.files.append(str(f))
        counts.rows_read += len(raw.rows) + len(raw.bad)
        split_filter = None
        keep = None
        mode = carve_split
        if mode is None:
            has_split = "split" in raw.columns and (
                adapter is None or adapter.columns == _TLDR_COLS
            )
            mode = not has_split
            if has_split:
                split_filter = lambda row: _row_split(row) == split  # noqa: E731
        if mode:
            rows = list(raw.rows)
            raw = RawRows(rows, raw.label, raw.columns, raw.bad)
            keep = carve(len(rows), split)
            counts.carve_min_rows = carve_min_rows()
        cap = max_samples - len(examples) if max_samples else 0
        exs, bad = _convert_rows(
            adapter, raw, str(f), keep, skip_bad_rows, options, cap, split_filter, counts
        )
        examples += exs
        n_bad += bad
        if max_samples and len(examples) >= max_samples:
            break
    return examples, n_bad


def _load_hub(
    adapter: Adapter,
    split: str,
    skip_bad_rows: bool,
    max_samples: int,
    options: dict,
    counts: SourceCounts,
) -> tuple[list[Example], int]:
    import datasets

    hub_split = adapter.splits[split]
    source = f"{adapter.hub_id}[{hub_split or 'train'}]"
    try:
        if adapter.hub_files:
            url = f"hf://datasets/{adapter.hub_id}/{adapter.hub_files[hub_split or 'train']}"
            ds = datasets.load_dataset("json", data_files=url, split="train")
        else:
            ds = datasets.load_dataset(
                adapter.hub_id, adapter.hub_config, split=hub_split or "train"
            )
    except Exception as e:  # noqa: BLE001
        raise DataError(
            f"{adapter.hub_id}: cannot load from the hub ({type(e).__name__}: {e}); "
            "download it elsewhere and pass the local files instead"
        ) from e
    counts.files.append(source)
    counts.rows_read += len(ds)
    keep = None
    if hub_split is None:
        keep = carve(len(ds), split)
        counts.carve_min_rows = carve_min_rows()
    raw = RawRows(ds, lambda i: f"{source} row {i + 1}", frozenset(ds.column_names), [])
    return _convert_rows(
        adapter, raw, source, keep, skip_bad_rows, options, max_samples, None, counts
    )


def iter_examples(
    specs: Iterable[str], split: str, **kw
) -> Iterator[tuple[str, list[Example], int]]:
    """``(spec, examples, n_bad)`` for each ``data_path`` entry."""
    for spec in specs:
        exs, n_bad = load_examples(spec, split, **kw)
        yield spec, exs, n_bad
