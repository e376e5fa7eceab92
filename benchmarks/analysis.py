"""Pure analysis shared by the experiments of ``benchmarks/`` (``ppo_vs_mappo.py``, ``horizon_sweep.py``).

Per-step curves of runs (``load_run``), the summaries over seeds (t-intervals, Welch's interval of a
difference: :mod:`marlhf.stats`; a seed bootstrap of the speed-up) and MA-RLHF's training-speed measure: the first step at which an arm's
smoothed mean gold curve reaches the baseline's final gold, and ``baseline steps / that step``.
Standard library only (``load_run`` reads ``marlhf.runtime.tracking``), so tests import it directly
(tests/benchmarks/test_ppo_vs_mappo.py, tests/benchmarks/test_horizon_sweep.py check it against hand-worked numbers).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from marlhf.stats import mean_ci, percentile, welch_diff_ci

BASELINE = "ppo"


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average: point i is the mean of ``values[max(0, i-window+1) : i+1]``.

    Trailing (not centred) so a smoothed curve at step s uses no information from after s.

    >>> smooth([0.0, 3.0, 6.0, 3.0], 2)
    [0.0, 1.5, 4.5, 4.5]
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def final_value(values: Sequence[float], window: int) -> float:
    """Mean of the last ``window`` values (the de-noised end of a curve).

    >>> final_value([0.0, 1.0, 2.0, 4.0], 2)
    3.0
    """
    if not values:
        return float("nan")
    return statistics.fmean(values[-window:])


def first_reach(steps: Sequence[int], curve: Sequence[float], target: float) -> int | None:
    """The first step whose curve value is >= ``target`` (None if never).

    >>> first_reach([1, 2, 3, 4], [0.1, 0.5, 0.4, 0.7], 0.45)
    2
    >>> first_reach([1, 2], [0.1, 0.2], 0.45) is None
    True
    """
    for s, v in zip(steps, curve, strict=True):
        if v >= target:
            return s
    return None


def speedup(baseline_steps: int, reach_step: int | None) -> float | None:
    """MA-RLHF's training-speed measure: baseline PPO steps / steps the arm needed to match it.

    >>> speedup(60, 30), speedup(60, None)
    (2.0, None)
    """
    if reach_step is None:
        return None
    return baseline_steps / reach_step


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    """Pointwise mean of equally long curves (one per seed), truncated to the shortest.

    >>> mean_curve([[0.0, 1.0, 2.0], [2.0, 3.0]])
    [1.0, 2.0]
    """
    n = min(len(c) for c in curves)
    return [statistics.fmean(c[i] for c in curves) for i in range(n)]


@dataclass
class ArmSummary:
    """Final values (mean, 95 % CI half-width over seeds) and the speed-up of one arm."""

    arm: str
    n_seeds: int
    steps: int
    gold: tuple[float, float]
    score: tuple[float, float]
    kl: tuple[float, float]
    macro_len: float
    step_time: float
    gold_vs_ppo: tuple[float, float]  # Welch difference of final gold to the baseline
    reach_step: int | None  # smoothed mean gold curve first >= baseline final gold
    speedup: float | None
    seeds_reached: int  # seeds whose own smoothed gold curve reaches the baseline final gold


def summarize(
    runs: dict[str, dict[int, dict[str, list[float]]]],
    *,
    baseline: str = BASELINE,
    final_window: int = 5,
    smooth_window: int = 5,
) -> list[ArmSummary]:
    """Summaries of every arm from ``runs[arm][seed][metric] -> per-step values`` (steps 1..n).

    Metrics used: ``gold``, ``score``, ``kl``, ``macro_len``, ``step_time``. The baseline's final gold
    is the mean over its seeds of each seed's last-``final_window`` mean; an arm's reach step is the
    first step at which the smoothed (``smooth_window``) mean-over-seeds gold curve attains it.
    """
    base = runs[baseline]
    base_final = [final_value(m["gold"], final_window) for m in base.values()]
    target = statistics.fmean(base_final)
    base_steps = min(len(m["gold"]) for m in base.values())
    out = []
    for arm, seeds in runs.items():
        finals = {
            k: [final_value(m[k], final_window) for m in seeds.values()]
            for k in ("gold", "score", "kl", "macro_len", "step_time")
        }
        curve = smooth(mean_curve([m["gold"] for m in seeds.values()]), smooth_window)
        steps = list(range(1, len(curve) + 1))
        reach = first_reach(steps, curve, target)
        per_seed = [
            first_reach(
                list(range(1, len(m["gold"]) + 1)), smooth(m["gold"], smooth_window), target
            )
            for m in seeds.values()
        ]
        out.append(
            ArmSummary(
                arm=arm,
                n_seeds=len(seeds),
                steps=len(curve),
                gold=mean_ci(finals["gold"]),
                score=mean_ci(finals["score"]),
                kl=mean_ci(finals["kl"]),
                macro_len=statistics.fmean(finals["macro_len"]),
                step_time=statistics.fmean(finals["step_time"]),
                gold_vs_ppo=welch_diff_ci(finals["gold"], base_final),
                reach_step=reach,
                speedup=speedup(base_steps, reach),
                seeds_reached=sum(r is not None for r in per_seed),
            )
        )
    return out


@dataclass
class Bootstrap:
    """A seed bootstrap of the speed-up: the 2.5 % and 97.5 % nearest-rank percentiles of the
    resampled speed-ups (a resample whose mean curve never reaches the target counts as 0), and
    the share of resamples that reach it."""

    low: float
    high: float
    reached: float
    n: int


def bootstrap_speedup(
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    final_window: int,
    smooth_window: int,
    n_boot: int = 2000,
    seed: int = 0,
) -> Bootstrap:
    """95 % percentile interval of MA-RLHF's speed-up over seeds, by resampling seeds.

    ``base`` and ``arm``: one gold curve per seed (steps 1..n). Each of ``n_boot`` resamples draws
    the baseline's seeds and the arm's seeds with replacement (independently), takes the target =
    mean over the drawn baseline seeds of their final value (last ``final_window`` steps), and the
    speed-up = baseline steps / first step of the arm's smoothed mean curve at or above the target
    (0 when it never gets there). Deterministic for a ``seed``.

    >>> b = bootstrap_speedup([[0.0, 1.0, 1.0, 1.0]], [[0.0, 1.0, 1.0, 1.0]], final_window=1,
    ...                       smooth_window=1, n_boot=10)
    >>> b.low, b.high, b.reached  # one seed each: every resample is the data (4 steps / step 2)
    (2.0, 2.0, 1.0)
    """
    rng = random.Random(seed)
    base_steps = min(len(c) for c in base)
    samples = []
    for _ in range(n_boot):
        b = [base[rng.randrange(len(base))] for _ in base]
        a = [arm[rng.randrange(len(arm))] for _ in arm]
        target = statistics.fmean(final_value(c, final_window) for c in b)
        curve = smooth(mean_curve(a), smooth_window)
        reach = first_reach(list(range(1, len(curve) + 1)), curve, target)
        samples.append(speedup(base_steps, reach) or 0.0)
    return Bootstrap(
        low=percentile(samples, 0.025),
        high=percentile(samples, 0.975),
        reached=sum(x > 0 for x in samples) / n_boot,
        n=n_boot,
    )


def pm(x: tuple[float, float], digits: int = 3) -> str:
    """``mean ± half-width`` (the mean alone when the half-width is NaN).

    >>> pm((1.0, 0.25)), pm((1.0, float("nan")), 1)
    ('1.000 ± 0.250', '1.0')
    """
    m, h = x
    return f"{m:.{digits}f}" if math.isnan(h) else f"{m:.{digits}f} ± {h:.{digits}f}"


METRIC_KEYS = {
    "gold": "objective/gold",
    "score": "objective/score",
    "kl": "objective/kl",
    "macro_len": "macro/mean_len",
    "step_time": "time/step",
    # the cost of macro_mc (NaN for the other arms)
    "mc_time": "time/mc",
    "mc_continuations": "mc/continuations",
    "mc_boundaries": "mc/boundaries",
    # segmentation + estimation (the parser's cost with `parsing`), response length, EOS rate
    "macro_time": "time/macro",
    "length": "response/length",
    "eos_rate": "response/eos_rate",
}


def last_rows(metrics_file: Path) -> list[dict]:
    """A ``metrics.jsonl``'s rows, one a step in step order: the last logged row of each step, so
    a resumed run counts once."""
    from marlhf.runtime.tracking import read_metrics

    by_step: dict[int, dict] = {}
    for row in read_metrics(metrics_file):
        by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def load_run(metrics_file: Path) -> dict[str, list[float]]:
    """Per-step metrics of one PPO run (:func:`last_rows`: a resumed run counts once)."""
    rows = last_rows(metrics_file)
    run = {k: [float(r.get(key, float("nan"))) for r in rows] for k, key in METRIC_KEYS.items()}
    run["step"] = [float(r["step"]) for r in rows]
    # cumulative training time (excludes model loading)
    run["elapsed"] = list(itertools.accumulate(run["step_time"]))
    return run
