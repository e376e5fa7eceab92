"""Tuning every arm on its own grid before a comparison (``horizon_sweep.py --tune``).

A comparison of MA-PPO against PPO at one shared setting answers "which is better at the paper's
setting", not "which is better": GAE's λ trades bias for variance per *decision*, so the best λ of
token-level PPO (one decision a token) and of a macro-action arm (one decision per n tokens) need not
be the same, and neither need their learning rates. The tuning mode gives every arm the same grid
(λ × actor learning rate), runs it on the tuning seeds, keeps each arm's best setting by a rule fixed
in advance (:func:`choose`), and reports the arms at their chosen settings on other seeds, so the
tuning noise does not leak into the reported figures.

Selection rule: the mean over tuning seeds of ``(final training gold + held-out gold) / 2``, where
final training gold is the mean of the run's last 5 steps (80 rollouts at 16 a step) and held-out gold
the mean over 32 held-out prompts at T = 1 after training: two estimates of the same end quality, so
their mean halves neither's noise but uses both. Ties (and settings with a missing run) resolve to the
earlier setting of the grid's order (λ, then learning rate, as given).

Besides the means, :func:`stability` gives what λ = 1 risks: the spread over seeds and how steadily
a seed's curve rises (its largest fall from its own running maximum, on the trailing-5 curve).

Standard library only, so tests import it directly (tests/benchmarks/test_horizon_sweep.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The grid every arm gets (both ends of GAE's λ, and the sweep's actor learning rate and twice it)
TUNE_LAMS = (0.95, 1.0)
TUNE_LRS = (1e-4, 2e-4)
TUNE_SEEDS = (1, 2, 3)


@dataclass(frozen=True, order=True)
class Setting:
    """One point of the tuning grid: GAE's λ and the actor's learning rate."""

    lam: float
    lr: float

    @property
    def label(self) -> str:
        """``λ=0.95, lr=1e-04``"""
        return f"λ={self.lam:g}, lr={self.lr:.0e}"


def grid(lams: Sequence[float] = TUNE_LAMS, lrs: Sequence[float] = TUNE_LRS) -> list[Setting]:
    """Every (λ, lr) pair in the grid's order (λ first).

    >>> [s.label for s in grid((0.95, 1.0), (1e-4,))]
    ['λ=0.95, lr=1e-04', 'λ=1, lr=1e-04']
    """
    return [Setting(lam, lr) for lam in lams for lr in lrs]


def estimator_of(flags: Sequence[str]) -> str:
    """The ``--advantage_estimator`` a run's stage flags name (the stage's default: ``gae``).

    >>> estimator_of(["--ngram", "5"]), estimator_of(["--advantage_estimator", "grpo"])
    ('gae', 'grpo')
    """
    flags = list(flags)
    if "--advantage_estimator" in flags:
        return flags[flags.index("--advantage_estimator") + 1]
    return "gae"


def reads_lambda(flags: Sequence[str]) -> bool:
    """Whether GAE's λ enters a run with these stage flags: its estimator is GAE (by the stage's own
    estimator registry; the critic-free estimators, ``macro_mc``, ``grpo`` and the like, do not read
    ``--lam``). Imports the package on first use; the rest of this module is standard library."""
    from marlhf.algo.registry import resolve_estimator

    return resolve_estimator(estimator_of(flags)) == "gae"


def arm_grid(
    flags: Sequence[str], lams: Sequence[float] = TUNE_LAMS, lrs: Sequence[float] = TUNE_LRS
) -> list[Setting]:
    """The grid of an arm with these stage flags, in the grid's order: every (λ, lr) pair for an
    arm that reads λ (:func:`reads_lambda`), the learning rates at λ = 1 alone for one that does
    not (at another λ it would be the same run again)."""
    return grid(lams if reads_lambda(flags) else (1.0,), lrs)


def selection_score(final_gold: Sequence[float], held_out_gold: Sequence[float]) -> float:
    """The selection rule's score of one arm at one setting: the mean over seeds of the mean of a
    seed's final training gold and its held-out gold (NaN without any seed).

    >>> selection_score([0.4, 0.6], [0.2, 0.4])
    0.4
    """
    pairs = [(f + h) / 2 for f, h in zip(final_gold, held_out_gold, strict=True)]
    return statistics.fmean(pairs) if pairs else float("nan")


def choose(scores: Mapping[Setting, float], order: Sequence[Setting]) -> Setting | None:
    """The setting with the highest score; ties and NaN scores resolve to the earlier setting of
    ``order`` (None: no setting has a score).

    >>> a, b, c = grid((0.95, 1.0), (1e-4, 2e-4))[:3]
    >>> choose({a: 0.5, b: 0.7, c: 0.7}, [a, b, c]) == b
    True
    """
    best, best_score = None, -math.inf
    for s in order:
        v = scores.get(s, float("nan"))
        if not math.isnan(v) and v > best_score:
            best, best_score = s, v
    return best


def max_drawdown(curve: Sequence[float]) -> float:
    """The largest fall of ``curve`` below its own running maximum (0 for a curve that never falls).

    >>> max_drawdown([0.1, 0.5, 0.2, 0.6, 0.55])
    0.3
    """
    peak, worst = -math.inf, 0.0
    for v in curve:
        peak = max(peak, v)
        worst = max(worst, peak - v)
    return round(worst, 12)


@dataclass
class Stability:
    """The variance side of one arm over its seeds."""

    n_seeds: int
    sd_final: float  # seed-to-seed standard deviation of the final training gold
    sd_held_out: float  # ... of the held-out gold
    drawdown: float  # mean over seeds of the trailing-5 curve's largest fall below its running max
    collapsed: int  # seeds whose final training gold ends below their step-1 gold


def stability(
    curves: Sequence[Sequence[float]],
    finals: Sequence[float],
    held_out: Sequence[float],
    smoothed: Sequence[Sequence[float]],
) -> Stability:
    """:class:`Stability` of one arm from its seeds' raw gold ``curves``, their ``finals`` (last-5
    means), held-out gold and trailing-smoothed curves.

    >>> s = stability([[0.0, 1.0], [0.5, 0.2]], [1.0, 0.2], [0.9, 0.1], [[0.0, 0.5], [0.5, 0.35]])
    >>> (s.n_seeds, round(s.sd_final, 4), round(s.drawdown, 3), s.collapsed)
    (2, 0.5657, 0.075, 1)
    """

    def sd(xs: Sequence[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else float("nan")

    return Stability(
        n_seeds=len(curves),
        sd_final=sd(finals),
        sd_held_out=sd(held_out),
        drawdown=statistics.fmean(max_drawdown(c) for c in smoothed) if smoothed else float("nan"),
        collapsed=sum(f < c[0] for f, c in zip(finals, curves, strict=True)),
    )
