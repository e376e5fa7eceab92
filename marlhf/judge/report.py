"""The summary of a judge run (``<output>.summary.json``): counts, win rate with its bootstrap interval,
length control, position-bias diagnostics, token usage and cost, printed and written; and whether
any pair got a verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from marlhf.judge.client import Usage
from marlhf.judge.collect import _Judged
from marlhf.judge.config import JudgeConfig, prices
from marlhf.judge.cost import _fmt_cost
from marlhf.judge.outcomes import format_summary, summarize
from marlhf.judge.prompts import JudgeTemplate


def _summary(
    cfg: JudgeConfig, template: JudgeTemplate, j: _Judged, usage: Usage, extra: dict[str, Any]
) -> dict[str, Any]:
    """Counts, win rate, CI, length control, position bias, usage and cost (module doc)."""
    summary = summarize(
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
            c: summarize(v, seed=cfg.seed, n_boot=cfg.bootstrap) for c, v in j.criteria.items()
        }
    return summary


def _print_report(cfg: JudgeConfig, summary: dict[str, Any], out_path: Path, log: TextIO) -> None:
    print(format_summary(summary, "a", "b"), file=log)
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
