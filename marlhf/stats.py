"""The statistics of the project's reports and experiments, in one place (standard library only):
Student-t intervals of a mean and Welch's interval of a difference (over seeds), a percentile
bootstrap of a mean (over prompts or judged pairs), nearest-rank percentiles, Pearson's correlation.
Used by the demo's report (:mod:`marlhf.pipeline.report`), the judge's summary
(:mod:`marlhf.judge.outcomes`) and the benchmarks (``benchmarks/analysis.py``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _finite(xs: Sequence[float]) -> bool:
    """Whether every value is finite (``statistics.stdev`` raises on a NaN or an infinity)."""
    return all(math.isfinite(x) for x in xs)


def t975(df: float) -> float:
    """Two-sided 95 % Student-t critical value for ``df`` degrees of freedom (floored: conservative).

    >>> t975(2), t975(4.7), t975(1000)
    (4.303, 2.776, 1.96)
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    d = int(math.floor(df))
    return _T975[d - 1] if d <= len(_T975) else 1.96


def mean_ci(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of its 95 % t-interval over independent samples (seeds).

    One sample has no spread: its half-width is NaN, and so is that of samples with a NaN or an
    infinity (their mean is what :func:`statistics.fmean` makes of them).

    >>> m, h = mean_ci([1.0, 2.0, 3.0])  # sd 1, se 1/sqrt(3), t_2 = 4.303
    >>> m, round(h, 4)
    (2.0, 2.4843)
    """
    if len(xs) == 0:
        return float("nan"), float("nan")
    m = statistics.fmean(xs)
    if len(xs) < 2 or not _finite(xs):
        return m, float("nan")
    return m, t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def welch_diff_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``mean(a) - mean(b)`` and the half-width of its Welch 95 % interval (unequal variances).

    >>> d, h = welch_diff_ci([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])  # df = 2
    >>> d, round(h, 4)
    (2.0, 2.4843)
    """
    if len(a) < 2 or len(b) < 2 or not _finite(a) or not _finite(b):
        return statistics.fmean(a) - statistics.fmean(b), float("nan")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return d, 0.0
    # Welch-Satterthwaite degrees of freedom
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return d, t975(df) * math.sqrt(va + vb)


def percentile(xs: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of ``xs``: the smallest value with at least a
    fraction ``q`` of the values at or below it.

    >>> percentile([3.0, 1.0, 2.0, 4.0], 0.5), percentile([3.0, 1.0, 2.0, 4.0], 0.975)
    (2.0, 4.0)
    """
    if not xs or not 0 < q <= 1:
        raise ValueError(f"percentile needs values and 0 < q <= 1, got {len(xs)} values, q={q}")
    ordered = sorted(xs)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; NaN, NaN for none; NaN for a NaN or an
    infinity among them).

    >>> mean_sd([1.0, 2.0, 3.0]), mean_sd([4.0])
    ((2.0, 1.0), (4.0, 0.0))
    """
    if not xs:
        return float("nan"), float("nan")
    if not _finite(xs):
        return statistics.fmean(xs), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def bootstrap_mean_ci(
    xs: Sequence[float], *, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap ``(low, high)`` of the mean of ``xs`` (seeded ``random.Random``)."""
    if not xs:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    n = len(xs)
    stats = sorted(math.fsum(rng.choices(xs, k=n)) / n for _ in range(n_boot))
    return (
        stats[int(round((alpha / 2) * (n_boot - 1)))],
        stats[int(round((1 - alpha / 2) * (n_boot - 1)))],
    )


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation of two equally long sequences (NaN when either is constant)."""
    if len(a) != len(b):
        raise ValueError(f"pearson: {len(a)} and {len(b)} values")
    if len(a) < 2:
        return float("nan")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    num = math.fsum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    den = math.sqrt(math.fsum((x - ma) ** 2 for x in a) * math.fsum((y - mb) ** 2 for y in b))
    return num / den if den else float("nan")
