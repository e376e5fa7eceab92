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
``synthetic-arith-4|8|16``    multi-step arithmetic (``marlhf.data.reasoning_tasks``), generated on first
                              use; columns prompt/chosen/rejected/answer/steps, prompt as written;
                              ``meta["columns"]["answer"]`` holds the true result.
``Dahoas/full-hh-rlhf``,      columns prompt/response/chosen/rejected; prompt already
``Dahoas/rm-static``          ``"\\n\\nHuman: ...\\n\\nAssistant:"``; train / test.
``openai/webgpt_comparisons`` ``" Human: {question.full_text} Assistant:"``, answers ``" {answer}"`` (a
                              space after ``Assistant:``, as in DeepSpeed-Chat); higher score chosen,
                              a tie chooses answer_0 (or is skipped with ``--webgpt_skip_ties``);
                              citation marks ``[1]``, ``[2, 3]`` removed; train only -> 95/5 carve.
``codeparrot/apps``           APPS-paper prompt (question, starter code, call-based or stdin format);
                              chosen = first solution (None when there is none); ``meta`` holds the
                              ``input_output`` tests and ``fn_name``; no rejected; train / test.
plain local files             columns ``prompt`` (+ ``chosen``, ``rejected``, ``margin``); a prompt may be a
                              list of messages (``{"role", "content"}``), the answers text or messages.
``messages`` (local files)    a ``messages`` list ending with the assistant's answer (chosen), an
                              optional ``rejected`` answer; the prompt's plain text is HH-style.
``reasoning-gym:NAME``        a reasoning-gym task, generated (``marlhf.data.gym``, not an adapter).
============================  =========================================================================

A local file's other columns (besides those its adapter reads, ``id`` included) are kept in the
example's ``meta["columns"]``: PPO's reward functions and reward server receive them
(``marlhf.rewards.functions``).

Local paths (``.json``, ``.jsonl``, ``.csv``, ``.tsv``, ``.parquet`` or a directory of them,
optionally ``adapter:path``) are matched to an adapter by their columns. A directory's files are assigned to splits by name
(``train*`` -> train; ``valid*``, ``validation*``, ``eval*``, ``dev*``, ``test*`` -> eval). A single
file whose rows carry a ``split`` field (the TL;DR schema) is divided by it; any other single file
is all train, carved 95/5 like WebGPT.

Bad rows raise ``DataError`` naming the file, the row (1-based line for jsonl) and the field; with
``skip_bad_rows`` they are skipped, counted and the count is logged. Local JSON files are parsed here,
not through ``datasets`` (whose type inference rewrites a column of mixed types, e.g. decodes
``"choice": "1"`` to ``1`` when another row has an integer), so every row is read as written; so are
CSV / TSV files (their cells are text: a numeric field such as ``margin`` reads its text, an empty
cell is a missing value). They must be UTF-8 (a leading byte-order mark is ignored); a line with
other bytes is a bad row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from marlhf.data.chat import as_text, check_messages
from marlhf.data.long_tasks import TASKS as LONG_TASKS
from marlhf.data.reasoning_tasks import TASKS as ARITH_TASKS
from marlhf.data.schema import DataError, Example
from marlhf.rewards.code import parse_json

log = logging.getLogger(__name__)

# Bump when a template below or what a row becomes changes (it is part of the tokenised-data cache
# key). 2: WebGPT answers start with a space; TL;DR "choice" must be an integer; identical pairs dropped.
# 3: a local file's other columns are kept in meta["columns"] (reward functions read them).
TEMPLATES_VERSION = 3
_CITATION = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")


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


def _number(row: dict, key: str, where: str, options: dict | None = None) -> float | None:
    """The number in field ``key`` (None when missing); from a file of text cells (CSV,
    ``options["text_cells"]``) the number its text writes."""
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, str) and (options or {}).get("text_cells"):
        try:
            return float(value)
        except ValueError:
            raise DataError(f'{where}: field "{key}" must be a number, got {value!r}') from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataError(f'{where}: field "{key}" must be a number, got {type(value).__name__}')
    return float(value)


def other_columns(row: dict, used: Iterable[str]) -> dict:
    """A local row's columns besides those its adapter reads (``used``), as JSON values: the
    ``columns`` a reward function and a reward server receive (`marlhf.rewards.functions`)."""
    skip = set(used)
    out = {k: v for k, v in row.items() if k not in skip}
    return json.loads(json.dumps(out, default=str)) if out else {}


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


def _arith(name: str) -> Callable[[dict, str, dict], Example]:
    """A generated arithmetic row (``marlhf.data.reasoning_tasks.generate``): the prompt as written,
    the correct solution chosen, the wrong one rejected; the true result (an integer) in
    ``meta["columns"]["answer"]``, where answer-checking rewards read a row's reference."""

    def convert(row: dict, where: str, options: dict) -> Example:
        prompt = _text(row, "prompt", where)
        answer = _get(row, "answer", where)
        if type(answer) is not int:
            raise DataError(f'{where}: field "answer" must be an integer, got {answer!r}')
        pid = row.get("id")
        return Example(
            prompt=prompt,
            chosen=_text(row, "chosen", where),
            rejected=_opt_text(row, "rejected", where),
            margin=None,
            prompt_id=f"{name}/{pid}" if pid is not None else _hash_id(name, prompt),
            meta={"columns": {"answer": answer}},
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
    s0, s1 = _number(row, "score_0", where, options), _number(row, "score_1", where, options)
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


def _answer(row: dict, key: str, where: str) -> str:
    """A response given as text or as messages (its last message, the assistant's)."""
    value = row.get(key)
    if isinstance(value, list):
        msgs = check_messages(value, where, key)
        if msgs[-1]["role"] != "assistant" or not msgs[-1]["content"].strip():
            raise DataError(f'{where}: field "{key}" must end with a non-empty assistant message')
        return msgs[-1]["content"]
    return _text(row, key, where)


def _messages(row: dict, where: str, options: dict) -> Example:
    """A conversation: ``messages`` up to the last assistant message (the chosen answer); an
    optional ``rejected`` answer (text or messages)."""
    msgs = check_messages(row.get("messages"), where)
    if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
        raise DataError(
            f'{where}: field "messages" must hold a user turn and end with the assistant\'s answer'
        )
    prompt_msgs, chosen = msgs[:-1], msgs[-1]["content"]
    if not chosen.strip():
        raise DataError(f'{where}: field "messages" ends with an empty assistant message')
    rejected = _answer(row, "rejected", where) if row.get("rejected") is not None else None
    prompt = as_text(prompt_msgs)
    pid = row.get("id")
    meta: dict = {"messages": prompt_msgs}
    columns = other_columns(row, ("messages", "rejected", "margin", "id"))
    if columns:
        meta["columns"] = columns
    return Example(
        prompt=prompt,
        chosen=chosen,
        rejected=rejected,
        margin=_number(row, "margin", where, options),
        prompt_id=f"local/{pid}" if pid is not None else _hash_id("local", prompt),
        meta=meta,
    )


def _plain(row: dict, where: str, options: dict) -> Example:
    cols = options.get("columns", frozenset())
    meta: dict = {}
    if isinstance(row.get("prompt"), list):  # conversational: the prompt as messages
        meta["messages"] = check_messages(row["prompt"], where, "prompt")
        prompt = as_text(meta["messages"])
    else:
        prompt = _text(row, "prompt", where)
    chosen = _answer(row, "chosen", where) if "chosen" in cols else None
    rejected = _answer(row, "rejected", where) if "rejected" in cols else None
    margin = _number(row, "margin", where, options)
    if margin is not None and not math.isfinite(margin):
        raise DataError(f'{where}: field "margin" must be finite, got {margin}')
    columns = other_columns(row, ("prompt", "chosen", "rejected", "margin", "id"))
    if columns:
        meta["columns"] = columns
    pid = row.get("id")
    return Example(
        prompt=prompt,
        chosen=chosen,
        rejected=rejected,
        margin=margin,
        prompt_id=f"local/{pid}" if pid is not None else _hash_id("local", prompt),
        meta=meta,
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
        # the multi-step arithmetic tasks (marlhf.data.reasoning_tasks): generated on first use
        *(
            Adapter(
                name,
                None,
                None,
                {"train": "train", "eval": "valid"},
                frozenset({"prompt", "chosen", "answer"}),
                _arith(name),
            )
            for name in ARITH_TASKS
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
            "messages",
            None,
            None,
            {"train": "train", "eval": None},
            frozenset({"messages"}),
            _messages,
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
    "messages",
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
