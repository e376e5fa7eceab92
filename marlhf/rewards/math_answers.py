"""``--reward_source math``: 1 when the response's final answer equals the row's reference answer
in value, else 0, checked by ``math-verify`` (``pip install math-verify``): both are parsed to
SymPy (LaTeX, ``\\boxed{}``, plain numbers and expressions, percentages) and compared, so ``0.5``,
``\\frac{1}{2}`` and ``1/2`` agree. The reference is the row's ``answer`` column, else its
``solution`` column (a worked solution whose ``\\boxed{}`` answer is taken).

A reference that math-verify cannot parse is an error naming the row (or a 0 under
``--reward_errors zero``). math-verify bounds each parse and comparison with a timer that needs the
main thread (where the stage scores). Declared in :mod:`marlhf.rewards.registry`.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass

import torch

from marlhf.rewards.registry import RewardContext
from marlhf.rewards.terms import RewardBatch, RewardTerm, refuse

ANSWER_COLUMNS = ("answer", "solution")


def reference_answer(meta: dict) -> str | None:
    """The row's reference: its ``answer`` column, else its ``solution`` (as text); None if none."""
    columns = meta.get("columns") or {}
    for name in ANSWER_COLUMNS:
        value = columns.get(name)
        if value is not None and not isinstance(value, bool) and str(value).strip():
            return str(value)
    return None


def has_reference(meta: dict | str) -> bool:
    """Whether a prompt's ``meta`` (a dict, or its JSON) holds a reference answer."""
    return reference_answer(json.loads(meta or "{}") if isinstance(meta, str) else meta) is not None


def parse_reference(text: str) -> list:
    """``math_verify.parse`` of a reference answer: as written, else, when that finds nothing and
    the text holds a LaTeX command, as LaTeX (``$...$``: ``\\sqrt{2}/2``; plain words are not read
    as products of symbols)."""
    from math_verify import parse

    found = parse(text)
    if not found and "$" not in text and "\\" in text:
        found = parse(f"${text}$")
    return found


def answers_match(reference: str, response: str) -> bool:
    """Whether ``response``'s final answer equals ``reference`` in value (math-verify)."""
    from math_verify import parse, verify

    gold = parse_reference(reference)
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {reference!r}")
    return bool(verify(gold, parse(response)))


def require_math_verify(flag: str = "--reward_source math") -> None:
    """ValueError naming ``flag`` when math-verify is not installed."""
    if importlib.util.find_spec("math_verify") is None:
        raise ValueError(f"{flag} needs the math-verify package: pip install math-verify")


@dataclass(frozen=True)
class MathAnswers:
    """1.0 for each response whose answer equals its row's reference (:func:`answers_match`),
    else 0.0; logs ``reward/math`` (the share correct)."""

    errors: str = "raise"

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        values = torch.zeros(len(batch))
        n_errors = 0
        for b, (meta, response) in enumerate(zip(batch.metas, batch.completions, strict=True)):
            reference = reference_answer(meta)
            try:
                if reference is None:
                    raise ValueError("it has no answer or solution column")
                values[b] = float(answers_match(reference, response))
            except ValueError as e:
                refuse(self.errors, f"--reward_source math, {batch.row(b)}: {e}")
                n_errors += 1
        return [RewardTerm("math", values, errors=n_errors)]


def build_source(ctx: RewardContext) -> MathAnswers:
    """The ``math`` source of a run (``ctx.errors``: ``--reward_errors``)."""
    return MathAnswers(ctx.errors)
