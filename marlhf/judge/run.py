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

from marlhf.judge import stats
from marlhf.judge.cache import JudgeCache, cache_key
from marlhf.judge.client import JudgeRequest, RetryPolicy, run_requests
from marlhf.judge.pairing import Pair, align_results
from marlhf.judge.parse import combine, parse_reply, to_model
from marlhf.judge.prompts import JudgeTemplate, get_template, render

DATASETS = ("summarize", "hh-rlhf", "webgpt")

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
    dataset: str = field(
        default="summarize",
        metadata={"help": "Judge template to use.", "choices": DATASETS},
    )
    sk: str | None = field(
        default=None,
        repr=False,
        metadata={"help": "API key (compatibility flag; prefer OPENAI_API_KEY). Never logged."},
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

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset must be one of {DATASETS}, got {self.dataset!r}")
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
    items: Sequence[_Item], template: JudgeTemplate, cache: JudgeCache | None, cfg: JudgeConfig
) -> dict[str, Any]:
    """Token and cost estimate: input tokens ~ characters / 4, output ~ the template's typical reply."""
    keys = {it.request.key: it for it in items}
    todo = [it for k, it in keys.items() if cache is None or k not in cache]
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
    template = get_template(template_name or cfg.dataset)
    pairs = align_results(cfg.model_name_a, cfg.model_name_b)
    if cfg.limit is not None:
        pairs = pairs[: cfg.limit]
    out_path = Path(cfg.output)
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else out_path.parent / ".judge_cache"
    cache = JudgeCache(cache_dir)
    items = build_requests(pairs, template, cfg.judge_model)
    est = estimate(items, template, cache, cfg)
    print(
        f"judge {cfg.judge_model} ({template.version}): {len(pairs)} pairs x 2 orders = "
        f"{est['requests_total']} requests, {est['requests_cached']} cached, "
        f"{est['requests_to_send']} to send",
        file=log,
    )
    print(
        f"estimate: ~{est['input_tokens_est']} input + ~{est['output_tokens_est']} output tokens, "
        f"cost {_fmt_cost(est['cost_usd_est'])}",
        file=log,
    )
    if cfg.dry_run:
        return {"estimate": est}

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
        )
    finally:
        if bar is not None:
            bar.close()

    records, outcomes, len_a, len_b = [], [], [], []
    crit_outcomes: dict[str, list[str]] = {c: [] for c in template.criteria}
    first_pos = []  # position verdicts of valid replies, for the position-bias diagnostic
    for i in range(0, len(items), 2):
        pair = items[i].pair
        orders = {}
        model_v = []
        crit_v: dict[str, list[str]] = {c: [] for c in template.criteria}
        for it, res in ((items[i], results[i]), (items[i + 1], results[i + 1])):
            parsed = parse_reply(res.reply, template.criteria)
            mv = to_model(parsed.verdict, it.order) if res.reply is not None else "invalid"
            model_v.append(mv)
            if mv != "invalid":
                first_pos.append(parsed.verdict)
            for c in template.criteria:
                crit_v[c].append(to_model(parsed.criteria[c], it.order))
            orders[it.order] = {
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
        outcome = combine(*model_v)
        outcomes.append(outcome)
        len_a.append(stats.n_words(pair.response_a))
        len_b.append(stats.n_words(pair.response_b))
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
                crit_outcomes[c].append(rec["criteria_outcome"][c])
        records.append(rec)

    summary = stats.summarize(
        outcomes, len_a, len_b, seed=cfg.seed, n_boot=cfg.bootstrap, tolerance=cfg.length_tolerance
    )
    valid_both = [
        r for r in records if all(o["model_verdict"] != "invalid" for o in r["orders"].values())
    ]
    agree = sum(
        r["orders"]["ab"]["model_verdict"] == r["orders"]["ba"]["model_verdict"] for r in valid_both
    )
    pin, pout = prices(cfg)
    summary.update(
        {
            "outcome_rule": "each pair judged in both orders; agreement keeps the verdict, "
            "disagreement counts as a tie, an invalid order makes the pair invalid",
            "position_consistency": agree / len(valid_both) if valid_both else None,
            "first_position_preferred": (
                sum(v == "A" for v in first_pos) / len(first_pos) if first_pos else None
            ),
            "judge_model": cfg.judge_model,
            "template": template.version,
            "dataset": template.name,
            "model_a": str(cfg.model_name_a),
            "model_b": str(cfg.model_name_b),
            "seed": cfg.seed,
            "base_url": base_url,
            "api_key_source": key_source,
            "estimate": est,
            "usage": {
                "requests_sent": usage.requests,
                "replies_cached": usage.cached,
                "failed": usage.failed,
                "retries": usage.retries,
                "errors": usage.errors,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
            },
            "cost_usd": usage.cost(pin, pout),
        }
    )
    if template.criteria:
        summary["criteria"] = {
            c: stats.summarize(v, seed=cfg.seed, n_boot=cfg.bootstrap)
            for c, v in crit_outcomes.items()
        }

    out_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(out_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    _atomic_write(
        out_path.with_name(out_path.name + ".summary.json"),
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n",
    )
    print(stats.format_summary(summary, "a", "b"), file=log)
    print(f"a = {cfg.model_name_a}\nb = {cfg.model_name_b}", file=log)
    for c, s in summary.get("criteria", {}).items():
        wr = s["win_rate"]
        print(
            f"  {c}: wins={s['wins']} ties={s['ties']} losses={s['losses']} "
            f"invalid={s['invalid']} win rate " + ("n/a" if wr is None else f"{wr:.3f}"),
            file=log,
        )
    print(
        f"position consistency {summary['position_consistency']}, usage: {usage.requests} requests "
        f"({usage.retries} retries, {usage.failed} failed, {usage.cached} cached), "
        f"{usage.prompt_tokens} input + {usage.completion_tokens} output tokens, "
        f"cost {_fmt_cost(summary['cost_usd'])}",
        file=log,
    )
    print(f"wrote {out_path} and {out_path.name}.summary.json", file=log)
    return summary


def main(argv: Sequence[str] | None = None, *, force_template: str | None = None) -> int:
    """CLI entry point of the judge scripts."""
    from marlhf.cli import parse_config
    from marlhf.judge.pairing import PairingError

    cfg = parse_config(JudgeStage, argv).judge
    template_name = None
    if force_template is not None:
        template_name = force_template
        if cfg.dataset != force_template:
            print(
                f"note: this script always uses the {force_template} template "
                f"(--dataset {cfg.dataset} ignored)",
                file=sys.stderr,
            )
    try:
        run_judge(cfg, template_name=template_name)
    except PairingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
