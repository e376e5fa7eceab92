"""See the macro actions of result files already written: ``python -m marlhf.view RESULTS.jsonl``.

Each response of an inference result file is cut into macro actions by the rule its policy was
trained with (``run_config.json`` next to the actor; `marlhf.inference.macro_rule`), or by the
macro-action flags given here, and shown in the terminal (coloured, or ``|`` after each macro action
without a terminal) and in an HTML page with a histogram of macro-action lengths
(``RESULTS.macro.html`` and ``RESULTS.macro_lengths.png``, as inference's ``--render-macro`` writes).

The policy is the one that wrote the file (its ``.meta.json``) unless ``--model`` names another; its
tokenizer re-tokenises the responses (the exact ids when the file was written with
``--save_token_ids``). Rules that read the reference model (``ppl``, ``entropy``) get its
quantities from the policy.
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
from marlhf.config import ModelConfig
from marlhf.inference.config import InferenceConfig
from marlhf.inference.macro_rule import describe, resolve_macro
from marlhf.inference.macro_view import macro_items, write_macro_page, write_macro_view
from marlhf.inference.models import Models, load_models
from marlhf.inference.naming import sidecar
from marlhf.inference.prompts import left_pad, prompt_token_ids
from marlhf.inference.results import read_rows
from marlhf.macro import build_termination
from marlhf.macro.config import MacroConfig
from marlhf.macro.render import macro_groups, render_terminal
from marlhf.models.load import load_tokenizer

log = logging.getLogger("marlhf.inference")


@dataclass
class ViewConfig:
    """What to show and where."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Policy whose tokenizer and trained rule to use (default: the one "
            "that wrote the file, from its .meta.json)."
        },
    )
    num: int = field(
        default=5, metadata={"help": "Responses shown per file (0: all).", "aliases": ("-n",)}
    )
    html: str | None = field(
        default=None,
        metadata={"help": "HTML page to write (default <results>.macro.html; `none`: no page)."},
    )
    terminal: bool = field(default=True, metadata={"help": "Print the responses in the terminal."})
    color: str = field(
        default="auto",
        metadata={
            "help": "Terminal colours (auto: when stdout is a terminal and NO_COLOR is unset).",
            "choices": ("auto", "always", "never"),
        },
    )

    def __post_init__(self) -> None:
        if self.num < 0:
            raise ValueError(f"--num must be >= 0, got {self.num}")


@dataclass
class ViewArgs:
    """All flags of the viewer (the CLI is generated from these parts)."""

    view: ViewConfig = field(default_factory=ViewConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)


def _settings(path: str) -> dict:

    meta = sidecar(path, "meta")
    if not os.path.exists(meta):
        return {}
    with open(meta, encoding="utf-8") as f:
        return json.load(f).get("settings", {})


def _response_ids(tok, row: dict) -> list[int]:
    """The row's response tokens: its saved ids, else the response re-tokenised (+ eos if it ended
    with one)."""
    ids = row.get("response_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        ids = ids[0]  # APPS rows: the first program
    if isinstance(ids, list):
        return [int(i) for i in ids]
    ids = tok(row.get("response", ""), add_special_tokens=False)["input_ids"]
    if row.get("ends_with_eos") is True and tok.eos_token_id is not None:
        ids = ids + [tok.eos_token_id]
    return ids


def _batch(tok, rows: list[dict], max_prompt_len: int):
    """The rows as a batch: prompt ids and mask (N, P) left-padded, response ids (N, A)
    right-padded, action mask (N, A) bool and whether each response ends with EOS (N,)."""
    ids, _ = prompt_token_ids(tok, [r.get("prompt", "") for r in rows], max_prompt_len)
    prompt_ids, prompt_mask = left_pad(ids, tok.pad_token_id)
    resp = [_response_ids(tok, r) or [tok.pad_token_id] for r in rows]
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
        print(f"\n[{n}] {rows[n].get('prompt_id', '')}{extra}")
        print(render_terminal(it["pieces"], it["macro_end"], color=on))


def view_file(path: str, cfg: ViewConfig, flags: MacroConfig, given=None) -> dict:
    """Cut the first ``cfg.num`` responses of ``path`` into macro actions; print and write them.
    ``given``: the macro-action fields set on the command line (`resolve_macro`). Returns
    ``{"html": path or None, "rule": description, "source": ..., "items": [...]}``."""
    rows = [r for r in read_rows(path) if r.get("response") is not None]
    if not rows:
        raise ValueError(f"{path}: no response rows to show")
    rows = rows[: cfg.num] if cfg.num else rows
    settings = _settings(path)
    model = cfg.model or settings.get("model_path") or settings.get("model")
    if not model:
        raise ValueError(f"{path}: no .meta.json naming the policy; pass --model")
    macro, source = resolve_macro(model, flags, given)
    tok = load_tokenizer(ModelConfig(model_name_or_path=model), padding_side="left")
    rule = build_termination(macro, tok)
    models = Models(None, tok, None, None, torch.device("cpu"))
    if rule.needs & {"ref_logprobs", "ref_entropy"}:  # ppl / entropy read the policy
        icfg = InferenceConfig(model=model, gpu=0, dtype="fp32")
        models = load_models(icfg, torch.device("cpu"), need_policy=True)
    batch = _batch(tok, rows, int(settings.get("max_prompt_len", 512)))
    prompts, rewards = [r.get("prompt", "") for r in rows], [r.get("reward") for r in rows]
    temperature, seed = float(settings.get("temperature", 1.0)), int(settings.get("seed", 0))
    items = macro_items(rule, models, *batch, prompts, rewards, temperature, seed)
    lengths = [e - s for it in items for s, e in macro_groups(it["macro_end"])]
    if cfg.terminal:
        head = (
            f"{path}: {len(items)} responses, macro actions {describe(macro)} (rule from "
            f"{source}); mean length {sum(lengths) / max(len(lengths), 1):.2f} tokens"
        )
        _print_items(head, rows, items, cfg.color)
    html = None
    if (cfg.html or "").lower() != "none":
        if cfg.html:
            html = write_macro_page(cfg.html, items, macro, source)
        else:
            html = write_macro_view(path, items, macro, source)
    return {"html": html, "rule": describe(macro), "source": source, "items": items}


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
    for path in files:
        try:
            out.append(view_file(path, args.view, args.macro, frozenset(given)))
        except (ValueError, OSError) as err:
            raise SystemExit(f"error: {err}") from None
    return out
