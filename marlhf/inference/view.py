"""See the macro actions of result files already written: ``python -m marlhf.view RESULTS.jsonl``.

Each response of an inference result file is cut into macro actions by the rule its policy was
trained with (``run_config.json`` next to the actor; `marlhf.inference.macro_rule`), or by the
macro-action flags given here, and shown in the terminal (coloured, or ``|`` after each macro action
without a terminal) and in an HTML page ending with the histogram of macro-action lengths
(``RESULTS.macro.html``, the histogram also in ``RESULTS.macro_lengths.png``, as inference's
``--render-macro`` writes; the page's path is printed). Control characters of a response (terminal
escapes, bidirectional overrides) are shown as escapes (`marlhf.macro.render.visible`).
A row of an episode (``marlhf infer --env``, a row with ``turns``) is shown turn by turn: each
policy turn with its reward and its macro actions (a macro action never spans an observation,
`marlhf.inference.turn_view`), each observation between them as context. A page that
would overwrite a result file or its ``.meta.json`` is refused.

Rows without a response and a half-written last line (inference still running) are not shown,
with a warning naming their lines; a complete last row without its newline is shown. A missing
file, a line that is not UTF-8 or JSON, and a field of the wrong type are an ``error:`` line naming
the file, line and field; so is a parsing rule whose spaCy pipeline or parser is not installed
(with how to install it).

The policy is the one that wrote the file (its ``.meta.json``) unless ``--model`` names another; its
tokenizer re-tokenises the responses (the exact ids when the file was written with
``--save_token_ids``). Rules that read the reference model (``ppl``, ``entropy``) get its
quantities from the policy, and ``lowprob`` the policy's log-probs of the response's tokens (at the
file's sampling temperature).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from marlhf.cli import build_parser, config_from_namespace, given_dests
from marlhf.config import ModelConfig, flag
from marlhf.inference.config import InferenceConfig
from marlhf.inference.macro_rule import describe, resolve_macro
from marlhf.inference.macro_view import (
    POLICY_INPUTS,
    default_page,
    macro_items,
    page_files,
    write_macro_page,
)
from marlhf.inference.models import Models, load_models
from marlhf.inference.naming import sidecar
from marlhf.inference.prompts import left_pad, prompt_token_ids
from marlhf.inference.turn_view import check_turns, turn_items
from marlhf.macro import build_termination
from marlhf.macro.config import MacroConfig
from marlhf.macro.render import macro_groups, render_terminal, render_terminal_turns, visible
from marlhf.models.load import load_tokenizer
from marlhf.stages.exits import raised_on_purpose

log = logging.getLogger("marlhf.inference")


@dataclass
class ViewConfig:
    """What to show and where."""

    model: str | None = flag(
        None,
        "Policy whose tokenizer and trained rule to use (default: the one "
        "that wrote the file, from its .meta.json).",
    )
    num: int = flag(5, "Responses shown per file (0: all).", aliases=("-n",))
    html: str | None = flag(
        None, "HTML page to write (default <results>.macro.html; `none`: no page)."
    )
    terminal: bool = flag(True, "Print the responses in the terminal.")
    color: str = flag(
        "auto",
        "Terminal colours (auto: when stdout is a terminal and NO_COLOR is unset).",
        choices=("auto", "always", "never"),
    )

    def __post_init__(self) -> None:
        if self.num < 0:
            raise ValueError(f"--num must be >= 0, got {self.num}")


@dataclass
class ViewArgs:
    """All flags of the viewer (the CLI is generated from these parts)."""

    view: ViewConfig = field(default_factory=ViewConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)


def _line_list(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:5])) + (
        f" and {len(numbers) - 5} more" * (len(numbers) > 5)
    )
    return f"line{'s' * (len(numbers) > 1)} {shown}"


def _check_fields(row: dict, where: str) -> None:
    """ValueError naming the line and field of a value of the wrong type."""

    def bad(name: str, want: str) -> ValueError:
        got = type(row[name]).__name__
        return ValueError(f'{where}: field "{name}" must be {want}, got {got} {row[name]!r:.40}')

    if not isinstance(row["response"], str):
        raise bad("response", "a string")
    if row.get("prompt") is not None and not isinstance(row["prompt"], str):
        raise bad("prompt", "a string")
    reward = row.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise bad("reward", "a number")
    if "ends_with_eos" in row and not isinstance(row["ends_with_eos"], bool):
        raise bad("ends_with_eos", "true or false")
    if row.get("turns") is not None:
        check_turns(row, where)
    ids = row.get("response_ids")
    if ids is not None:
        first = ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], list) else ids
        if not isinstance(first, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in first
        ):
            raise bad("response_ids", "a list of token ids")


def read_view_rows(path: str) -> tuple[list[dict], list[int], list[str]]:
    """The rows of a result file that have a response, their line numbers, and warnings about
    what is not shown (rows without a response, a half-written last line: inference still
    running). A complete last row without its newline is shown. ValueError naming the file, line
    and field for a missing file, a line that is not UTF-8 or JSON, a value of the wrong type."""
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path}: a directory, not a result file")
    with open(path, "rb") as f:
        data = f.read()
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    torn = not data.endswith(b"\n")
    rows, lines, notes, without = [], [], [], []
    for lineno, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        where = f"{path} line {lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{where}: not UTF-8 (byte 0x{line[e.start]:02x} at byte {e.start + 1} of the line)"
            ) from None
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            if torn and lineno == len(raw):
                notes.append(
                    f"{where}: a half-written last line (inference still running?); not shown"
                )
                continue
            raise ValueError(f"{where}: not valid JSON at column {e.colno} ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not a JSON object")
        if row.get("response") is None:
            without.append(lineno)
            continue
        _check_fields(row, where)
        rows.append(row)
        lines.append(lineno)
    if without:
        notes.insert(0, f'{path} {_line_list(without)}: no "response" (missing or null); not shown')
    return rows, lines, notes


def _settings(path: str) -> dict:
    """The settings the result file was written with (its ``.meta.json``; {} without one)."""
    meta = sidecar(path, "meta")
    if not os.path.exists(meta):
        return {}
    try:
        with open(meta, encoding="utf-8") as f:
            settings = json.load(f).get("settings", {})
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{meta}: not a result file's settings ({err})") from None
    if not isinstance(settings, dict):
        raise ValueError(f'{meta}: field "settings" must be an object')
    return settings


def _response_ids(tok, row: dict, where: str = "") -> list[int]:
    """The row's response tokens: its saved ids, else the response re-tokenised (+ eos if it ended
    with one). ``where``: the row's file and line, for an id outside the tokenizer's vocabulary."""
    ids = row.get("response_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        ids = ids[0]  # APPS rows: the first program
    if isinstance(ids, list):
        out = [int(i) for i in ids]
        if any(i >= len(tok) for i in out):
            raise ValueError(
                f'{where}: field "response_ids" holds id {max(out)}, outside the vocabulary of '
                f"{len(tok)} tokens (a file of another model? pass --model)"
            )
        return out
    ids = tok(row.get("response", ""), add_special_tokens=False)["input_ids"]
    if row.get("ends_with_eos") is True and tok.eos_token_id is not None:
        ids = ids + [tok.eos_token_id]
    return ids


def _batch(tok, rows: list[dict], max_prompt_len: int, where: list[str]):
    """The rows as a batch: prompt ids and mask (N, P) left-padded, response ids (N, A)
    right-padded, action mask (N, A) bool and whether each response ends with EOS (N,).
    ``where``: each row's file and line."""
    ids, _ = prompt_token_ids(tok, [r.get("prompt") or "" for r in rows], max_prompt_len)
    prompt_ids, prompt_mask = left_pad(ids, tok.pad_token_id)
    resp = [
        _response_ids(tok, r, w) or [tok.pad_token_id] for r, w in zip(rows, where, strict=True)
    ]
    A = max(len(r) for r in resp)
    response = torch.full((len(rows), A), tok.pad_token_id, dtype=torch.long)
    action_mask = torch.zeros(len(rows), A, dtype=torch.bool)
    for b, r in enumerate(resp):
        response[b, : len(r)] = torch.tensor(r)
        action_mask[b, : len(r)] = True
    ends = torch.tensor([r[-1] == tok.eos_token_id for r in resp])
    return prompt_ids, prompt_mask, response, action_mask, ends


def _print_items(head: str, rows: list[dict], items: list[dict], color: str) -> None:
    print(head)
    on = {"auto": None, "always": True, "never": False}[color]
    for n, it in enumerate(items):
        extra = "" if it["reward"] is None else f"  reward {float(it['reward']):.4f}"
        row = rows[n]
        if it.get("turns") is None:
            print(f"\n[{n}] {visible(str(row.get('prompt_id', '')))}{extra}")
            print(render_terminal(it["pieces"], it["macro_end"], color=on))
            continue
        played = f"  {row.get('num_turns', '?')} turns, {visible(str(row.get('stop', '?')))}"
        print(f"\n[{n}] {visible(str(row.get('prompt_id', '')))}{extra}{played}")
        if row.get("env_error"):
            print(f"env error: {visible(str(row['env_error']))}")
        print(f"prompt: {visible(str(it['prompt']))}")
        print(render_terminal_turns(it["turns"], color=on))


def view_file(path: str, cfg: ViewConfig, flags: MacroConfig, given=None) -> dict:
    """Cut the first ``cfg.num`` responses of ``path`` into macro actions; print and write them.
    ``given``: the macro-action fields set on the command line (`resolve_macro`). Returns
    ``{"html": path or None, "rule": description, "source": ..., "items": [...]}``; rows not
    shown are warned about (logger ``marlhf.inference``)."""
    rows, lines, notes = read_view_rows(path)
    for note in notes:
        log.warning("%s", note)
    if not rows:
        raise ValueError(f"{path}: no response rows to show")
    if cfg.num:
        rows, lines = rows[: cfg.num], lines[: cfg.num]
    settings = _settings(path)
    model = cfg.model or settings.get("model_path") or settings.get("model")
    if not model:
        raise ValueError(f"{path}: no .meta.json naming the policy; pass --model")
    macro, source = resolve_macro(model, flags, given)
    tok = load_tokenizer(ModelConfig(model_name_or_path=model), padding_side="left")
    rule = build_termination(macro, tok)
    models = Models(None, tok, None, None, torch.device("cpu"))
    if rule.needs & POLICY_INPUTS:  # ppl / entropy / lowprob read the policy
        icfg = InferenceConfig(model=model, gpu=0, dtype="fp32")
        models = load_models(icfg, torch.device("cpu"), need_policy=True)
    where = [f"{path} line {n}" for n in lines]
    temperature, seed = float(settings.get("temperature", 1.0)), int(settings.get("seed", 0))
    # rows of episodes (marlhf infer --env) are cut turn by turn; the others as one response
    multi = [b for b, r in enumerate(rows) if r.get("turns") is not None]
    single = [b for b, r in enumerate(rows) if r.get("turns") is None]
    items: list[dict] = [{} for _ in rows]
    if single and "turn_end" in rule.needs:
        raise ValueError(
            f"{where[single[0]]}: --termination_condition turn cuts the rows of episodes (a "
            '"turns" field, as `marlhf infer --env` writes them); this row is one response'
        )
    if single:
        part, at = [rows[b] for b in single], [where[b] for b in single]
        batch = _batch(tok, part, int(settings.get("max_prompt_len", 512)), at)
        prompts, rewards = [r.get("prompt") or "" for r in part], [r.get("reward") for r in part]
        got = macro_items(rule, models, *batch, prompts, rewards, temperature, seed)
        for b, it in zip(single, got, strict=True):
            items[b] = it
    if multi:
        part, at = [rows[b] for b in multi], [where[b] for b in multi]
        for b, it in zip(multi, turn_items(rule, models, part, at, temperature, seed), strict=True):
            items[b] = it
    lengths = [e - s for it in items for s, e in macro_groups(it["macro_end"])]
    if cfg.terminal:
        head = (
            f"{path}: {len(items)} responses, macro actions {describe(macro)} (rule from "
            f"{source}); mean length {sum(lengths) / max(len(lengths), 1):.2f} tokens"
        )
        _print_items(head, rows, items, cfg.color)
    html = _page(path, cfg)
    if html is not None:
        write_macro_page(html, items, macro, source)
        png = page_files(html)[1]
        print(f"wrote {html}" + (f" (histogram of macro-action lengths: {png})" if lengths else ""))
    return {"html": html, "rule": describe(macro), "source": source, "items": items}


def _page(path: str, cfg: ViewConfig) -> str | None:
    """The page ``view_file`` writes for ``path`` (None: ``--html none``)."""
    if (cfg.html or "").lower() == "none":
        return None
    return cfg.html or default_page(path)


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(files: Sequence[str], cfg: ViewConfig) -> None:
    """ValueError when a page or histogram would overwrite a result file or its ``.meta.json``, or
    one ``--html`` page would hold several files (each would overwrite the one before)."""
    if cfg.html and cfg.html.lower() != "none" and len(files) > 1:
        raise ValueError(
            f"--html {cfg.html}: one page for {len(files)} result files (each would overwrite the "
            "one before); give one file, or leave --html out (each gets RESULTS.macro.html)"
        )
    inputs = [p for f in files for p in (f, sidecar(f, "meta"))]
    for f in files:
        page = _page(f, cfg)
        for out in page_files(page) if page is not None else ():
            hit = next((i for i in inputs if _same_file(out, i)), None)
            if hit is not None:
                flag = f"--html {cfg.html}: writing" if cfg.html else "writing"
                raise ValueError(
                    f"{flag} {out} would overwrite the input file {hit}; choose another --html"
                )


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Parse flags (see ``--help``), show every file."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(ViewArgs, (__doc__ or "").strip().splitlines()[0])
    parser.usage = "%(prog)s [-h] [--config FILE] [flags] RESULTS.jsonl [RESULTS.jsonl ...]"
    parser.add_argument(
        "results", nargs="+", metavar="RESULTS.jsonl", help="inference result files"
    )
    ns = parser.parse_args(argv)
    files = ns.results
    del ns.results
    args = config_from_namespace(ViewArgs, parser, ns)
    given = {d.split(".", 1)[1] for d in given_dests(parser, argv) if d.startswith("macro.")}
    out = []
    try:
        check_outputs(files, args.view)
        for path in files:
            out.append(view_file(path, args.view, args.macro, frozenset(given)))
    except (ValueError, OSError) as err:
        raise SystemExit(f"error: {err}") from None
    except RuntimeError as err:  # a missing spaCy pipeline or parser package: what to install
        if not raised_on_purpose(err):
            raise
        raise SystemExit(f"error: {err}") from None
    return out
