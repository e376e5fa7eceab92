"""What every reward of PPO shares: the batch it reads (:class:`RewardBatch`), the values it gives
(:class:`RewardTerm`), the checks those values pass (:func:`check_values`) and how a row's terms add
up (:func:`combine`). The sources that make the terms are registered in
:mod:`marlhf.rewards.registry` (no torch); a user's Python functions (``--reward_fn``,
:mod:`marlhf.rewards.functions`) and a reward server (``--reward_url``, :mod:`marlhf.rewards.remote`)
make terms the same way.

Shapes: B rows (responses) per batch.

A value may be None: that term gives no reward to that row; the row's reward is the sum of the
terms that scored it, and a row that no term scored is an error (:func:`combine`).

>>> import torch
>>> batch = RewardBatch(prompts=["a", "b"], completions=["x", "y"], metas=[{}, {}])
>>> values, scored, errors = check_values("f.py:f", [1, None], batch, errors="raise")
>>> values.tolist(), scored.tolist(), errors
([1.0, 0.0], [True, False], 0)
>>> t1 = RewardTerm("f", values, scored)
>>> t2 = RewardTerm("g", torch.tensor([0.5, 2.0]), weight=2.0)
>>> combine([t1, t2], batch, torch.device("cpu"), "raise")[0].tolist()
[2.0, 4.0]
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from marlhf.rewards.registry import RewardError

__all__ = [
    "RewardBatch",
    "RewardError",
    "RewardFn",
    "RewardTerm",
    "check_values",
    "combine",
    "refuse",
]

log = logging.getLogger("marlhf.rewards")


@dataclass(frozen=True)
class RewardBatch:
    """The rows a reward scores.

    Fields:
        prompts: B prompt texts (the task's own text, before any chat template).
        completions: B responses, decoded without special tokens.
        metas: B prompts' ``meta`` (test cases, the dataset's other columns under ``columns``,
            a reasoning-gym entry under ``reasoning_gym``).
        rm_scores: (B,) float, the reward model's end scores | None without a reward model.
    """

    prompts: list[str]
    completions: list[str]
    metas: list[dict]
    rm_scores: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.completions)

    def columns(self) -> dict[str, list]:
        """The rows' other dataset columns (``meta["columns"]``) as ``{column: B values}``, None
        where a row lacks the column; each column in the order its first row gives it."""
        names: dict[str, None] = {}
        for m in self.metas:
            names.update(dict.fromkeys((m.get("columns") or {}).keys()))
        return {c: [(m.get("columns") or {}).get(c) for m in self.metas] for c in names}

    def row(self, b: int) -> str:
        """How a message names row ``b``: its index in the batch and the start of its prompt."""
        text = self.prompts[b] if b < len(self.prompts) else ""
        short = " ".join(text.split())
        short = short[:60] + ("..." if len(short) > 60 else "")
        return f"row {b} of the batch (prompt {short!r})"


@dataclass(frozen=True)
class RewardTerm:
    """One reward's values for a batch.

    Fields:
        name: what it is logged as (``reward/<name>``; the built-ins ``rm``, ``code``, ``gold``
            are not logged this way: ``objective/score`` and ``code/*`` say it already).
        values: (B,) float, 0 where ``scored`` is false.
        scored: (B,) bool, the rows this term gave a reward | None: every row.
        weight: its coefficient in the sum.
        metrics: what it logs besides its mean (``code/*``).
        errors: values replaced by 0 under ``--reward_errors zero``.
        log_mean: log ``reward/<name>``, the mean over the rows it scored.
    """

    name: str
    values: torch.Tensor
    scored: torch.Tensor | None = None
    weight: float = 1.0
    metrics: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    log_mean: bool = True


# a built source: the batch -> its terms
RewardFn = Callable[[RewardBatch], Sequence[RewardTerm]]


# --------------------------------------------------------------------------------------------------
# the checks every value passes


def refuse(errors: str, message: str) -> None:
    """Raise :class:`RewardError` with ``message`` (``errors="raise"``), or log it as a warning: the
    value is scored 0 and counted (``--reward_errors zero``)."""
    if errors == "raise":
        raise RewardError(message)
    log.warning("%s; scored 0 (--reward_errors zero)", message)


def check_values(
    name: str, raw: Any, batch: RewardBatch, errors: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``raw`` (what the reward ``name`` returned for ``batch``: one int, float or None per row)
    as ``(values (B,) float32, scored (B,) bool, errors)``. A value that is not a finite number,
    an answer that is not a list of B values, raises :class:`RewardError` naming ``name``, the row
    and the value; with ``errors="zero"`` it is scored 0 and counted instead."""
    B = len(batch)
    values = torch.zeros(B, dtype=torch.float32)
    scored = torch.ones(B, dtype=torch.bool)
    if hasattr(raw, "tolist") and not isinstance(raw, list | tuple):  # numpy arrays, tensors
        raw = raw.tolist()
    if not isinstance(raw, list | tuple):
        refuse(
            errors, f"{name} returned {type(raw).__name__} {_show(raw)}, not a list of {B} values"
        )
        return values, scored, B
    if len(raw) != B:
        refuse(errors, f"{name} returned {len(raw)} values for a batch of {B} rows")
        return values, scored, B
    n_errors = 0
    for b, v in enumerate(raw):
        if v is None:
            scored[b] = False
        elif isinstance(v, numbers.Real) and math.isfinite(float(v)):
            values[b] = float(v)
        else:
            what = "not a finite number" if isinstance(v, numbers.Real) else type(v).__name__
            refuse(errors, f"{name}, {batch.row(b)}: returned {_show(v)} ({what}); a reward is a "
                   "finite int or float, or None for no reward")  # fmt: skip
            n_errors += 1
    return values, scored, n_errors


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def combine(
    terms: Sequence[RewardTerm], batch: RewardBatch, device: torch.device, errors: str
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sequence-level reward of each row, (B,) float32 on ``device``: the weighted sum of the
    terms that scored it, added in the order of ``terms``; and the metrics: each term's own, its
    ``reward/<name>`` (the mean over the rows it scored, 0 when none) and, for a term that may
    leave rows unscored, ``reward/<name>/scored`` (the share it scored); ``reward/errors`` (values
    scored 0) under ``--reward_errors zero``. A row no term scored raises :class:`RewardError`
    (or is scored 0 and counted)."""
    B = len(batch)
    scores = torch.zeros(B, device=device)
    covered = torch.zeros(B, dtype=torch.bool)
    metrics: dict[str, float] = {}
    n_errors = 0
    for t in terms:
        v = t.values.to(device)
        if t.scored is None and t.weight == 1.0:  # the built-ins: one addition, as ever
            scores = scores + v
        else:
            mask = torch.ones(B, dtype=torch.bool) if t.scored is None else t.scored
            scores = scores + t.weight * torch.where(mask.to(device), v, torch.zeros_like(v))
        covered = covered | (True if t.scored is None else t.scored)
        metrics.update(t.metrics)
        n_errors += t.errors
        if t.log_mean:
            n = B if t.scored is None else int(t.scored.sum())
            total = float(t.values.sum()) if t.scored is None else float(t.values[t.scored].sum())
            metrics[f"reward/{t.name}"] = total / n if n else 0.0
            if t.scored is not None:
                metrics[f"reward/{t.name}/scored"] = n / B if B else 0.0
    if terms:
        for b in (~covered).nonzero()[:, 0].tolist():
            refuse(errors, f"{batch.row(b)}: no reward scored it (every reward returned None)")
            n_errors += 1
    if errors == "zero":
        metrics["reward/errors"] = float(n_errors)
    return scores, metrics
