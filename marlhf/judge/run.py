"""The LLM-judge pipeline behind ``evaluation/gpt4-eval.py`` and ``evaluation/gpt4-webgpt-eval.py``.

1. align the two result files (:mod:`marlhf.judge.pairing`);
2. build two requests per pair, model a shown first (order ``ab``) and model b shown first (``ba``);
3. print a cost estimate (tokens ~ characters / 4; ``--dry_run`` stops here);
4. judge with bounded concurrency and retries, through the reply cache (:mod:`marlhf.judge.client`);
5. parse strictly, map positions back to models, combine the orders: agreement keeps the verdict,
   disagreement is a tie, an invalid order makes the pair invalid (:mod:`marlhf.judge.parse`);
6. write ``--output`` (one JSON object per pair with both orders' verdicts, reasons and raw replies)
   and ``<output>.summary.json`` (counts, win rate with ties = 1/2, bootstrap CI, length control,
   position-bias diagnostics, token usage and cost), and print the summary.

Invalid pairs are split into ``failed`` (a request failed: a re-run retries it) and ``unparseable``
(the judge replied without a valid verdict line). Every raw reply is cached, unparseable ones too, so a
parser fix needs no new request; ``--retry_unparseable`` asks the judge again for cached replies that
do not parse and replaces them. Empty or whitespace-only responses are judged as given, but counted
(``empty_responses``) and warned about. ``cost_usd`` is what this run paid; ``cost_usd_cached`` what the
cached replies it used cost when an earlier run bought them; ``cost_usd_total`` both. ``main`` exits 2
on bad input (``--output`` naming an input file, result files that do not pair up) and 1 when no pair
got a valid verdict (e.g. every request failed: connection refused, HTTP 401), after writing the files.

The API key comes from ``OPENAI_API_KEY`` (or ``--sk`` for compatibility with the original scripts); it
is never printed or written to any file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from marlhf.cli import parse_config
from marlhf.judge.cache import JudgeCache
from marlhf.judge.collect import _atomic_write, _send, collect, empty_responses, unparseable_cached
from marlhf.judge.config import (
    JUDGE_HELP,
    JudgeConfig,
    JudgeInputError,
    JudgeStage,
    check_output_path,
    template_for,
)
from marlhf.judge.cost import _fmt_cost, build_requests, estimate
from marlhf.judge.pairing import PairingError, align_results
from marlhf.judge.prompts import get_template
from marlhf.judge.report import _print_report, _summary, no_verdict_problem


def run_judge(
    cfg: JudgeConfig,
    *,
    template_name: str | None = None,
    log: TextIO | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the whole pipeline (module doc) and return the summary dict (``estimate`` only on dry run).

    ``template_name`` overrides ``cfg.dataset`` (the WebGPT script always uses ``webgpt``).
    """
    log = log or sys.stdout
    check_output_path(cfg)
    template = get_template(template_name or template_for(cfg.dataset or "summarize"))
    pairs = align_results(
        cfg.model_name_a, cfg.model_name_b, on_note=lambda note: print(note, file=log)
    )
    if cfg.limit is not None:
        pairs = pairs[: cfg.limit]
    empty = empty_responses(pairs, cfg, log)
    out_path = Path(cfg.output)
    cache = JudgeCache(Path(cfg.cache_dir) if cfg.cache_dir else out_path.parent / ".judge_cache")
    items = build_requests(pairs, template, cfg.judge_model)
    refresh = unparseable_cached(items, cache, template) if cfg.retry_unparseable else frozenset()
    est = estimate(items, template, cache, cfg, refresh)
    print(
        f"judge {cfg.judge_model} ({template.version}): {len(pairs)} pairs x 2 orders = "
        f"{est['requests_total']} requests, {est['requests_cached']} cached, "
        f"{est['requests_to_send']} to send"
        + (f" ({len(refresh)} asked again)" if refresh else ""),
        file=log,
    )
    print(
        f"estimate: ~{est['input_tokens_est']} input + ~{est['output_tokens_est']} output tokens, "
        f"cost {_fmt_cost(est['cost_usd_est'])}",
        file=log,
    )
    if cfg.dry_run:
        return {"estimate": est}

    results, usage, origin = _send(cfg, items, cache, est, refresh, progress)
    judged = collect(items, results, template)
    summary = _summary(cfg, template, judged, usage, {**origin, "estimate": est})
    summary["empty_responses"] = empty
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(
        out_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in judged.records)
    )
    _atomic_write(
        out_path.with_name(out_path.name + ".summary.json"),
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n",
    )
    _print_report(cfg, summary, out_path, log)
    return summary


SK_WARNING = (
    "warning: --sk puts the API key on the command line, in the process list where every user of "
    "this machine sees it "
    "(ps, /proc/<pid>/cmdline) and the shell history keeps it; set OPENAI_API_KEY in the "
    "environment instead (export OPENAI_API_KEY=..., or read it from a file you alone can read)"
)


def main(argv: Sequence[str] | None = None, *, force_template: str | None = None) -> int:
    """CLI entry point of the judge scripts: 0 on success, 2 on bad input, 1 if nothing was judged."""
    cfg = parse_config(JudgeStage, argv, description=JUDGE_HELP).judge
    if cfg.sk:
        print(SK_WARNING, file=sys.stderr)
    if force_template is not None and cfg.dataset is not None:
        if template_for(cfg.dataset) != force_template:
            print(
                f"note: this script always uses the {force_template} template "
                f"(--dataset {cfg.dataset} ignored)",
                file=sys.stderr,
            )
    try:
        summary = run_judge(cfg, template_name=force_template)
    except (PairingError, JudgeInputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    problem = no_verdict_problem(summary)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0
