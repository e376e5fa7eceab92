"""A judge run's requests (two per pair, one in each order) and the estimate of their tokens and cost,
printed before anything is sent (``--dry_run`` stops there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marlhf.judge.cache import JudgeCache, cache_key
from marlhf.judge.client import JudgeRequest
from marlhf.judge.config import JudgeConfig, prices
from marlhf.judge.pairing import Pair
from marlhf.judge.prompts import JudgeTemplate, render


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
