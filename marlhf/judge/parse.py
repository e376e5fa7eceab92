"""Strict parsing of judge replies and the two-order combination rule.

A reply is valid only if its last non-empty line is ``Verdict: [[A]]``, ``Verdict: [[B]]`` or
``Verdict: [[TIE]]`` (labels case-insensitive, surrounding whitespace and markdown bold ignored) and no
other line claims a verdict. Anything else is ``invalid``: the parser never guesses from free text
("A is better ..."), so a judge that drifts from the format shows up in the invalid count instead of
silently biasing the win rate.

Verdicts name *positions* (``A`` = shown first). :func:`to_model` maps them to the compared models
(``a`` = ``--model_name_a``) given the order the pair was shown in, and :func:`combine` merges the two
orders: agreement keeps the verdict, any disagreement (including one tie) counts as a tie (the
MT-Bench rule: a judgement that flips with position is position bias, not preference), and if either
order is invalid the pair is invalid.

>>> parse_verdict("Reason: B misses the point.\\nVerdict: [[A]]")
'A'
>>> parse_verdict("I prefer A.")
'invalid'
>>> combine(to_model("A", "ab"), to_model("B", "ba"))
'a'
>>> combine("a", "b")
'tie'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LABEL = r"\[\[\s*(A|B|TIE)\s*\]\]"
_VERDICT_LINE = re.compile(r"^\**\s*verdict\s*\**\s*:\s*\**\s*" + _LABEL + r"\s*\**\s*\.?$", re.I)
_ANY_VERDICT = re.compile(r"^\W*verdict\W*:", re.I)
_REASON_LINE = re.compile(r"^\**\s*reason\s*\**\s*:\s*(.*)$", re.I)

POSITIONS = ("A", "B", "tie")
OUTCOMES = ("a", "b", "tie", "invalid")


def _label(text: str) -> str:
    return "tie" if text.upper() == "TIE" else text.upper()


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.strip().splitlines() if ln.strip()]


def parse_verdict(text: str | None) -> str:
    """``'A'``, ``'B'``, ``'tie'`` or ``'invalid'`` from a raw judge reply (see module doc)."""
    if not text:
        return "invalid"
    lines = _lines(text)
    if not lines:
        return "invalid"
    if sum(1 for ln in lines if _ANY_VERDICT.match(ln)) != 1:
        return "invalid"
    m = _VERDICT_LINE.match(lines[-1])
    return _label(m.group(1)) if m else "invalid"


def parse_reason(text: str | None) -> str:
    """The ``Reason:`` line's text ('' if absent)."""
    for ln in _lines(text or ""):
        m = _REASON_LINE.match(ln)
        if m:
            return m.group(1).strip()
    return ""


def parse_criteria(text: str | None, criteria: tuple[str, ...]) -> dict[str, str]:
    """Per-criterion verdicts: each ``<criterion>: [[X]]`` line must appear exactly once, else that
    criterion is ``'invalid'``.

    >>> parse_criteria("Coherence: [[b]]\\nCoherence: [[A]]\\nFactual accuracy: [[TIE]]",
    ...                ("Factual accuracy", "Coherence", "Overall usefulness"))
    {'Factual accuracy': 'tie', 'Coherence': 'invalid', 'Overall usefulness': 'invalid'}
    """
    lines = _lines(text or "")
    out: dict[str, str] = {}
    for crit in criteria:
        head = re.compile(r"^\W*" + re.escape(crit) + r"\W*:", re.I)
        full = re.compile(
            r"^\**\s*" + re.escape(crit) + r"\s*\**\s*:\s*\**\s*" + _LABEL + r"\s*\**\s*\.?$", re.I
        )
        hits = [ln for ln in lines if head.match(ln)]
        m = full.match(hits[0]) if len(hits) == 1 else None
        out[crit] = _label(m.group(1)) if m else "invalid"
    return out


def to_model(position_verdict: str, order: str) -> str:
    """Map a position verdict to a model outcome. ``order`` is ``'ab'`` (model a shown as A) or
    ``'ba'`` (model b shown as A). Returns ``'a'``, ``'b'``, ``'tie'`` or ``'invalid'``."""
    if order not in ("ab", "ba"):
        raise ValueError(f"order must be 'ab' or 'ba', got {order!r}")
    if position_verdict in ("tie", "invalid"):
        return position_verdict
    if position_verdict not in ("A", "B"):
        raise ValueError(f"unknown position verdict {position_verdict!r}")
    first_is_a = order == "ab"
    return "a" if (position_verdict == "A") == first_is_a else "b"


def combine(first: str, second: str) -> str:
    """Outcome of a pair from its two model outcomes (one per order), see module doc."""
    if "invalid" in (first, second):
        return "invalid"
    return first if first == second else "tie"


@dataclass
class ParsedReply:
    """One judge reply, parsed: position verdict, reason and per-criterion position verdicts."""

    verdict: str
    reason: str
    criteria: dict[str, str] = field(default_factory=dict)


def parse_reply(text: str | None, criteria: tuple[str, ...] = ()) -> ParsedReply:
    """Parse verdict, reason and (if any) criteria of one reply."""
    return ParsedReply(parse_verdict(text), parse_reason(text), parse_criteria(text, criteria))
