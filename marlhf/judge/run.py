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
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from marlhf.datasets import canonical, names_help
from marlhf.judge import stats
from marlhf.judge.cache import JudgeCache, cache_key
from marlhf.judge.client import JudgeRequest, JudgeResult, RetryPolicy, Usage, run_requests
from marlhf.judge.pairing import Pair, align_results
from marlhf.judge.parse import ParsedReply, combine, parse_reply, to_model
from marlhf.judge.prompts import JudgeTemplate, get_template, render

# Dataset name (marlhf.datasets, the names every tool shares) -> judge template.
JUDGE_TEMPLATES = {
    "summarize": "summarize",
    "hh-rlhf": "hh-rlhf",
    "webgpt": "webgpt",
    "synthetic": "summarize",  # the bundled synthetic task is a TL;DR summarisation task
}
DATASETS = tuple(JUDGE_TEMPLATES)

# USD per 1M (input, output) tokens, list prices of OpenAI's API as published in 2024-2025; override
# with --price_input/--price_output for other models or when prices change.
PRICES_PER_1M: dict[str, tuple[float, float]] = {
    "gpt-4o-2024-05-13": (5.00, 15.00),
    "gpt-4o-2024-08-06": (2.50, 10.00),
    "gpt-4o-2024-11-20": (2.50, 10.00),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o-mini-2024-07-18": (0.15, 0.60),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4-turbo-2024-04-09": (10.00, 30.00),
    "gpt-4": (30.00, 60.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
}


@dataclass
class JudgeConfig:
    """Pairwise LLM-judge evaluation of two result files."""

    model_name_a: str = field(
        metadata={"help": "Result JSONL of model a.", "aliases": ("--model_a", "--model-name-a")}
    )
    model_name_b: str = field(
        metadata={"help": "Result JSONL of model b.", "aliases": ("--model_b", "--model-name-b")}
    )
    output: str = field(
        metadata={"help": "Per-pair results JSONL (summary: <output>.summary.json)."}
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": f"Dataset, which picks the judge template: {names_help(DATASETS)} "
            "(synthetic: the summarize template; apps has none, programs are scored by tests). "
            "Default summarize; gpt4-webgpt-eval.py always uses webgpt."
        },
    )
    sk: str | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "API key (compatibility flag; it shows in the process list: set "
            "OPENAI_API_KEY instead, a warning says so). Never logged."
        },
    )
    base_url: str | None = field(
        default=None,
        metadata={
            "help": "OpenAI-compatible endpoint (default: OPENAI_BASE_URL, else api.openai.com).",
            "aliases": ("--base-url",),
        },
    )
    judge_model: str = field(
        default="gpt-4o-2024-05-13",
        metadata={"help": "Judge model (a fixed snapshot).", "aliases": ("--judge-model",)},
    )
    concurrency: int = field(default=8, metadata={"help": "Requests in flight at most."})
    max_retries: int = field(
        default=5,
        metadata={
            "help": "Retries on 429/5xx/timeouts before an item is invalid.",
            "aliases": ("--max-retries",),
        },
    )
    retry_base_delay: float = field(
        default=1.0,
        metadata={
            "help": "First backoff in seconds (doubles each retry, with jitter).",
            "aliases": ("--retry-base-delay",),
        },
    )
    timeout: float = field(default=60.0, metadata={"help": "Per-request timeout in seconds."})
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Reply cache directory (default: .judge_cache next to --output).",
            "aliases": ("--cache-dir",),
        },
    )
    seed: int = field(default=42, metadata={"help": "Seed of the bootstrap, jitter and API seed."})
    limit: int | None = field(default=None, metadata={"help": "Judge only the first N pairs."})
    dry_run: bool = field(
        default=False,
        metadata={"help": "Print the cost estimate and exit.", "aliases": ("--dry-run",)},
    )
    price_input: float | None = field(
        default=None,
        metadata={
            "help": "USD per 1M input tokens (overrides the table).",
            "aliases": ("--price-input",),
        },
    )
    price_output: float | None = field(
        default=None,
        metadata={
            "help": "USD per 1M output tokens (overrides the table).",
            "aliases": ("--price-output",),
        },
    )
    bootstrap: int = field(
        default=2000, metadata={"help": "Bootstrap resamples for the 95 percent CI."}
    )
    length_tolerance: float = field(
        default=0.10,
        metadata={"help": "Relative length difference of a length-matched pair."},
    )
    retry_unparseable: bool = field(
        default=False,
        metadata={
            "help": "Ask the judge again for cached replies without a valid verdict (they are "
            "replaced in the cache); otherwise those pairs stay invalid on a re-run.",
            "aliases": ("--retry-unparseable",),
        },
    )

    def __post_init__(self) -> None:
        if self.dataset is not None:
            template_for(self.dataset)  # raises for a name without a judge template
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"--max_retries must be >= 0, got {self.max_retries}")
        if self.retry_base_delay < 0:
            raise ValueError(f"--retry_base_delay must be >= 0, got {self.retry_base_delay}")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        for name in ("price_input", "price_output"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"--{name} must be >= 0, got {v}")
        if self.bootstrap < 1:
            raise ValueError(f"--bootstrap must be >= 1, got {self.bootstrap}")
        if not 0 <= self.length_tolerance < 1:
            raise ValueError(f"--length_tolerance must be in [0, 1), got {self.length_tolerance}")


@dataclass
class JudgeStage:
    """Pairwise LLM-judge evaluation (one part, so the shared CLI generator can build the flags)."""

    judge: JudgeConfig


class JudgeInputError(ValueError):
    """Flags or files the judge cannot run with (``main`` exits 2)."""


def template_for(dataset: str) -> str:
    """The judge template of a dataset name or alias (``hh`` -> ``hh-rlhf``); ValueError otherwise."""
    name = canonical(dataset)
    if name == "apps":
        raise ValueError(
            "--dataset apps: the judge has no template for code; APPS programs are scored by their "
            "tests (inference/inference_with_rewards.py --dataset apps)"
        )
    if name not in JUDGE_TEMPLATES:
        raise ValueError(f"--dataset must be one of: {names_help(DATASETS)}; got {dataset!r}")
    return JUDGE_TEMPLATES[name]


def check_output_path(cfg: JudgeConfig) -> None:
    """Refuse an ``--output`` (or its summary file) that is one of the input files."""
    from marlhf.judge.pairing import output_overwrites

    problem = output_overwrites(
        cfg.output, {"--model_name_a": cfg.model_name_a, "--model_name_b": cfg.model_name_b}
    )
    if problem:
        raise JudgeInputError(problem)


def prices(cfg: JudgeConfig) -> tuple[float | None, float | None]:
    """(input, output) USD per 1M tokens: the flags if given, else the table, else None."""
    table = PRICES_PER_1M.get(cfg.judge_model, (None, None))
    pin = cfg.price_input if cfg.price_input is not None else table[0]
    pout = cfg.price_output if cfg.price_output is not None else table[1]
    return pin, pout


@dataclass
class _Item:
    pair: Pair
    order: str  # 'ab' or 'ba'
    request: JudgeRequest


def build_requests(pairs: Sequence[Pair], template: JudgeTemplate, judge_model: str) -> list[_Item]:
    """Two requests per pair: order ``ab`` (a shown as A) then ``ba``."""
    items = []
    for p in pairs:
        for order in ("ab", "ba"):
            first, second = (
                (p.response_a, p.response_b) if order == "ab" else (p.response_b, p.response_a)
            )
            key = cache_key(judge_model, template.version, p.prompt, first, second, order)
            msgs = render(template, p.prompt, first, second)
            items.append(_Item(p, order, JudgeRequest(key, msgs, template.max_tokens)))
    return items


def estimate(
    items: Sequence[_Item],
    template: JudgeTemplate,
    cache: JudgeCache | None,
    cfg: JudgeConfig,
    refresh: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Token and cost estimate: input tokens ~ characters / 4, output ~ the template's typical reply.
    ``refresh`` are cached keys that will be asked again (``--retry_unparseable``)."""
    keys = {it.request.key: it for it in items}
    todo = [it for k, it in keys.items() if cache is None or k not in cache or k in refresh]
    tok_in = sum(sum(len(m["content"]) for m in it.request.messages) // 4 for it in todo)
    tok_out = template.expected_output_tokens * len(todo)
    pin, pout = prices(cfg)
    cost = None if pin is None or pout is None else (tok_in * pin + tok_out * pout) / 1e6
    return {
        "requests_total": len(keys),
        "requests_cached": len(keys) - len(todo),
        "requests_to_send": len(todo),
        "input_tokens_est": tok_in,
        "output_tokens_est": tok_out,
        "price_input_per_1m": pin,
        "price_output_per_1m": pout,
        "cost_usd_est": cost,
    }


def _fmt_cost(c: float | None) -> str:
    return (
        "unknown (no price for this judge model; pass --price_input/--price_output)"
        if c is None
        else f"${c:.4f}"
    )


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _unparseable(parsed: ParsedReply) -> bool:
    """A reply without a valid verdict line, or (WebGPT) without a valid line per criterion."""
    return parsed.verdict == "invalid" or "invalid" in parsed.criteria.values()


def unparseable_cached(
    items: Sequence[_Item], cache: JudgeCache, template: JudgeTemplate
) -> frozenset[str]:
    """Keys whose cached reply does not parse (asked again with ``--retry_unparseable``)."""
    keys = set()
    for it in items:
        hit = cache.get(it.request.key)
        if hit is not None and _unparseable(parse_reply(hit.get("reply"), template.criteria)):
            keys.add(it.request.key)
    return frozenset(keys)


def empty_responses(pairs: Sequence[Pair], cfg: JudgeConfig, log: TextIO) -> dict[str, int]:
    """Count (and warn about) empty or whitespace-only responses on each side."""
    counts = {}
    for side, path in (("a", cfg.model_name_a), ("b", cfg.model_name_b)):
        lines = [
            getattr(p, f"line_{side}") for p in pairs if not getattr(p, f"response_{side}").strip()
        ]
        counts[side] = len(lines)
        if lines:
            shown = ", ".join(str(n) for n in lines[:5]) + (" ..." if len(lines) > 5 else "")
            print(
                f"warning: {path}: {len(lines)} empty or whitespace-only response(s) (line "
                f"{shown}); they are judged as given",
                file=log,
            )
    return counts


def _send(
    cfg: JudgeConfig,
    items: Sequence[_Item],
    cache: JudgeCache,
    est: dict[str, Any],
    refresh: frozenset[str],
    progress: bool,
) -> tuple[list[JudgeResult], Usage, dict[str, Any]]:
    """Judge every request (cache first); returns results, usage and where the key/server came from."""
    api_key = cfg.sk or os.environ.get("OPENAI_API_KEY")
    key_source = "--sk" if cfg.sk else "OPENAI_API_KEY"
    if not api_key:
        if est["requests_to_send"]:
            raise SystemExit("error: no API key: set OPENAI_API_KEY (or pass --sk)")
        api_key, key_source = "unused", "none (all replies cached)"
    base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL") or None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=est["requests_total"], desc="judging", unit="req", file=sys.stderr)
    try:
        results, usage = run_requests(
            [it.request for it in items],
            base_url=base_url,
            api_key=api_key,
            model=cfg.judge_model,
            timeout=cfg.timeout,
            cache=cache,
            concurrency=cfg.concurrency,
            retry=RetryPolicy(max_retries=cfg.max_retries, base_delay=cfg.retry_base_delay),
            seed=cfg.seed,
            on_done=(lambda _r: bar.update(1)) if bar is not None else None,
            refresh=refresh,
        )
    finally:
        if bar is not None:
            bar.close()
    return results, usage, {"base_url": base_url, "api_key_source": key_source}


@dataclass
class _Judged:
    """Per-pair records and the outcome lists the summary is computed from."""

    records: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    len_a: list[int] = field(default_factory=list)
    len_b: list[int] = field(default_factory=list)
    criteria: dict[str, list[str]] = field(default_factory=dict)
    first_pos: list[str] = field(default_factory=list)  # position verdicts of valid replies
    failed: int = 0  # invalid pairs with a failed request
    unparseable: int = 0  # invalid pairs whose replies arrived but did not parse
    replies_unparseable: int = 0


def _order(it: _Item, res: JudgeResult, template: JudgeTemplate) -> tuple[ParsedReply, dict]:
    """Parse one order's reply into its record (``model_verdict`` maps the position to a model)."""
    parsed = parse_reply(res.reply, template.criteria)
    mv = to_model(parsed.verdict, it.order) if res.reply is not None else "invalid"
    return parsed, {
        "shown_first": "a" if it.order == "ab" else "b",
        "verdict": parsed.verdict,
        "model_verdict": mv,
        "reason": parsed.reason,
        **({"criteria": parsed.criteria} if template.criteria else {}),
        "reply": res.reply,
        "error": res.error,
        "cached": res.cached,
        "attempts": res.attempts,
    }


def collect(
    items: Sequence[_Item], results: Sequence[JudgeResult], template: JudgeTemplate
) -> _Judged:
    """Combine the two orders of every pair (module doc) into records and outcome lists."""
    j = _Judged(criteria={c: [] for c in template.criteria})
    for i in range(0, len(items), 2):
        pair, orders = items[i].pair, {}
        crit_v: dict[str, list[str]] = {c: [] for c in template.criteria}
        for it, res in ((items[i], results[i]), (items[i + 1], results[i + 1])):
            parsed, orders[it.order] = _order(it, res, template)
            if res.reply is not None and _unparseable(parsed):
                j.replies_unparseable += 1
            if orders[it.order]["model_verdict"] != "invalid":
                j.first_pos.append(parsed.verdict)
            for c in template.criteria:
                crit_v[c].append(to_model(parsed.criteria[c], it.order))
        outcome = combine(orders["ab"]["model_verdict"], orders["ba"]["model_verdict"])
        if outcome == "invalid":
            if any(o["reply"] is None for o in orders.values()):
                j.failed += 1
            else:
                j.unparseable += 1
        j.outcomes.append(outcome)
        j.len_a.append(stats.n_words(pair.response_a))
        j.len_b.append(stats.n_words(pair.response_b))
        rec = {
            "index": i // 2,
            "prompt_id": pair.prompt_id,
            "prompt": pair.prompt,
            "response_a": pair.response_a,
            "response_b": pair.response_b,
            "orders": orders,
            "outcome": outcome,
        }
        if template.criteria:
            rec["criteria_outcome"] = {c: combine(*crit_v[c]) for c in template.criteria}
            for c in template.criteria:
                j.criteria[c].append(rec["criteria_outcome"][c])
        j.records.append(rec)
    return j


def _summary(
    cfg: JudgeConfig, template: JudgeTemplate, j: _Judged, usage: Usage, extra: dict[str, Any]
) -> dict[str, Any]:
    """Counts, win rate, CI, length control, position bias, usage and cost (module doc)."""
    summary = stats.summarize(
        j.outcomes,
        j.len_a,
        j.len_b,
        seed=cfg.seed,
        n_boot=cfg.bootstrap,
        tolerance=cfg.length_tolerance,
    )
    valid_both = [
        r for r in j.records if all(o["model_verdict"] != "invalid" for o in r["orders"].values())
    ]
    agree = sum(
        r["orders"]["ab"]["model_verdict"] == r["orders"]["ba"]["model_verdict"] for r in valid_both
    )
    pin, pout = prices(cfg)
    cost, cached = usage.cost(pin, pout), usage.cost_cached(pin, pout)
    errors = [o["error"] for r in j.records for o in r["orders"].values() if o["error"]]
    summary.update(
        {
            "unparseable": j.unparseable,
            "failed": j.failed,
            "replies_unparseable": j.replies_unparseable,
            "outcome_rule": "each pair judged in both orders; agreement keeps the verdict, "
            "disagreement counts as a tie, an invalid order makes the pair invalid",
            "position_consistency": agree / len(valid_both) if valid_both else None,
            "first_position_preferred": (
                sum(v == "A" for v in j.first_pos) / len(j.first_pos) if j.first_pos else None
            ),
            "judge_model": cfg.judge_model,
            "template": template.version,
            "dataset": template.name,
            "model_a": str(cfg.model_name_a),
            "model_b": str(cfg.model_name_b),
            "seed": cfg.seed,
            **extra,
            "usage": {
                "requests_sent": usage.requests,
                "replies_cached": usage.cached,
                "failed": usage.failed,
                "retries": usage.retries,
                "errors": usage.errors,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cached_prompt_tokens": usage.cached_prompt_tokens,
                "cached_completion_tokens": usage.cached_completion_tokens,
            },
            "first_error": errors[0] if errors else None,
            "cost_usd": cost,
            "cost_usd_cached": cached,
            "cost_usd_total": None if cost is None or cached is None else cost + cached,
        }
    )
    if template.criteria:
        summary["criteria"] = {
            c: stats.summarize(v, seed=cfg.seed, n_boot=cfg.bootstrap)
            for c, v in j.criteria.items()
        }
    return summary


def _print_report(cfg: JudgeConfig, summary: dict[str, Any], out_path: Path, log: TextIO) -> None:
    print(stats.format_summary(summary, "a", "b"), file=log)
    print(f"a = {cfg.model_name_a}\nb = {cfg.model_name_b}", file=log)
    for c, s in summary.get("criteria", {}).items():
        wr = s["win_rate"]
        print(
            f"  {c}: wins={s['wins']} ties={s['ties']} losses={s['losses']} "
            f"invalid={s['invalid']} win rate " + ("n/a" if wr is None else f"{wr:.3f}"),
            file=log,
        )
    if summary["unparseable"] and not cfg.retry_unparseable:
        print(
            f"{summary['unparseable']} pair(s) invalid because a reply had no valid verdict; "
            "pass --retry_unparseable to ask the judge again",
            file=log,
        )
    u = summary["usage"]
    print(
        f"position consistency {summary['position_consistency']}, usage: {u['requests_sent']} "
        f"requests ({u['retries']} retries, {u['failed']} failed, {u['replies_cached']} cached), "
        f"{u['prompt_tokens']} input + {u['completion_tokens']} output tokens, "
        f"cost {_fmt_cost(summary['cost_usd'])} this run, "
        f"{_fmt_cost(summary['cost_usd_total'])} for all replies used",
        file=log,
    )
    print(f"wrote {out_path} and {out_path.name}.summary.json", file=log)


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


def no_verdict_problem(summary: dict[str, Any]) -> str | None:
    """Why a finished run has no win rate (every pair invalid), or None if it has one."""
    if "win_rate" not in summary or summary["win_rate"] is not None:
        return None
    n, failed = summary["n"], summary["failed"]
    if failed == n:
        errors = ", ".join(f"{k}: {v}" for k, v in summary["usage"]["errors"].items())
        return (
            f"every judge request failed ({errors}); nothing was judged. Check the API key "
            f"({summary['api_key_source']}), the server (--base_url: "
            f"{summary['base_url'] or 'api.openai.com'}) and --judge_model; a re-run retries the "
            f"failed requests. First error: {summary['first_error']}"
        )
    return (
        f"no pair got a valid verdict ({summary['unparseable']} with unparseable replies, {failed} "
        "with failed requests), so there is no win rate; see the replies in --output "
        "(--retry_unparseable asks again)"
    )


SK_WARNING = (
    "warning: --sk puts the API key on the command line, in the process list where every user of "
    "this machine sees it "
    "(ps, /proc/<pid>/cmdline) and the shell history keeps it; set OPENAI_API_KEY in the "
    "environment instead (export OPENAI_API_KEY=..., or read it from a file you alone can read)"
)


def main(argv: Sequence[str] | None = None, *, force_template: str | None = None) -> int:
    """CLI entry point of the judge scripts: 0 on success, 2 on bad input, 1 if nothing was judged."""
    from marlhf.cli import parse_config
    from marlhf.judge.pairing import PairingError

    cfg = parse_config(JudgeStage, argv).judge
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
