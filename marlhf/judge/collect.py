"""Sending the requests through the reply cache and collecting the verdicts: each pair's two orders
parsed, mapped back to the models and combined, with the raw replies, usage and cost; unparseable
cached replies asked again on request; empty responses counted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from marlhf.judge.cache import JudgeCache
from marlhf.judge.client import JudgeResult, RetryPolicy, Usage, run_requests
from marlhf.judge.config import JudgeConfig
from marlhf.judge.cost import _Item
from marlhf.judge.outcomes import n_words
from marlhf.judge.pairing import Pair
from marlhf.judge.parse import ParsedReply, combine, parse_reply, to_model
from marlhf.judge.prompts import JudgeTemplate


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
        j.len_a.append(n_words(pair.response_a))
        j.len_b.append(n_words(pair.response_b))
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
