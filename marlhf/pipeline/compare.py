"""Compare runs: ``marlhf compare RUN... [--label L ...] [--output DIR]``.

Each RUN is a run directory (its ``metrics.jsonl``) or a glob of them; several runs with one label
are the seeds of one arm and are pooled. ``--label`` is given once per RUN argument (a glob's runs
share it) or, when the shell expanded the globs, once per arm the runs make without labels; without
labels an arm is named after what ran (``PPO``, ``MA-PPO n=5``, ``GRPO``, ``SFT``, ``RM (end)``:
the ``run_config.json``), else after the directory (:mod:`marlhf.pipeline.runs`). The first arm is
the baseline. Rows, values and runs left out (a half-written last line, a NaN, a run without rows,
a directory given twice), seeds stopping early and arms pooling different settings are warned
about, on stderr and in the report.

Writes ``DIR/report.md`` and one PNG per metric against step (stage 3: reward-model score, gold
where the task has one, KL, entropy, response length, macro-action length; SFT and reward-model
runs: training and held-out loss, perplexity, accuracy): the mean over seeds with its 95 % band
(Student t over seeds, per step). The report gives

- final values (each seed's mean over its last ``--final_window`` logged steps), mean ± 95 %
  t-interval over seeds, and each arm's difference to the baseline with Welch's 95 % interval;
- steps to reach a target (``--target``, default the baseline's final value of ``--target_metric``):
  the first step at which the arm's smoothed mean curve gets there, with a seed-bootstrap 95 %
  interval (resamples that never get there count as not reached);
- given inference result files (``--results A.jsonl B.jsonl``: the same prompts answered by two
  policies), the paired difference of RM score and gold over the prompts both answered, with a
  bootstrap 95 % interval, and the win rate of B over A (ties half) with its bootstrap interval.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from marlhf.cli import build_parser, config_from_namespace
from marlhf.config import flag
from marlhf.inference.results import read_rows
from marlhf.judge.outcomes import bootstrap_ci, win_rate
from marlhf.pipeline.report import paired_gain, rm_judged
from marlhf.pipeline.runs import Run, arms_of
from marlhf.stats import mean_ci, percentile, welch_diff_ci

# (metric key, title, file stem): stage 3's, then SFT's and the reward model's
METRICS = (
    ("objective/score", "reward-model score", "reward"),
    ("objective/gold", "gold score", "gold"),
    ("objective/kl", "KL(π‖π_ref)", "kl"),
    ("policy/entropy", "entropy", "entropy"),
    ("response/length", "response length (tokens)", "length"),
    ("macro/mean_len", "macro-action length (tokens)", "macro_len"),
    ("train/loss", "training loss", "train_loss"),
    ("eval/loss", "held-out loss", "eval_loss"),
    ("eval/ppl", "held-out perplexity", "eval_ppl"),
    ("eval/accuracy", "held-out accuracy (chosen scored above rejected)", "eval_accuracy"),
)


# --- curves (the statistics are marlhf.stats') ----------------------------------------------------
def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is).

    >>> smooth([0.0, 2.0, 4.0, 6.0], 2)
    [0.0, 1.0, 3.0, 5.0]
    """
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(statistics.fmean(chunk))
    return out


def first_reach(steps: Sequence[int], curve: Sequence[float], target: float) -> int | None:
    """The first step whose value is >= ``target`` (None if never).

    >>> first_reach([1, 2, 3], [0.1, 0.5, 0.4], 0.45), first_reach([1], [0.0], 1.0)
    (2, None)
    """
    return next((s for s, v in zip(steps, curve, strict=True) if v >= target), None)


def common_steps(runs: Sequence[Run], key: str) -> list[int]:
    """The steps every run of an arm logged ``key`` at."""
    sets = [set(r.series.get(key, {})) for r in runs]
    return sorted(set.intersection(*sets)) if sets and all(sets) else []


def band(runs: Sequence[Run], key: str) -> tuple[list[int], list[float], list[float]]:
    """Steps, mean over seeds and the 95 % t half-width (0 for one seed) at each step."""
    steps = common_steps(runs, key)
    means, halves = [], []
    for s in steps:
        m, h = mean_ci([r.series[key][s] for r in runs])
        means.append(m)
        halves.append(0.0 if math.isnan(h) else h)
    return steps, means, halves


def final_values(runs: Sequence[Run], key: str, window: int) -> list[float]:
    """Each seed's mean over its last ``window`` logged steps of ``key``."""
    out = []
    for r in runs:
        vals = [r.series[key][s] for s in sorted(r.series.get(key, {}))]
        if vals:
            out.append(statistics.fmean(vals[-window:]))
    return out


@dataclass
class Reach:
    """Steps an arm takes to reach a target: the mean curve's and a seed-bootstrap interval."""

    step: int | None
    low: int | None
    high: int | None
    reached: float  # share of bootstrap resamples that reach the target


def reach(runs: Sequence[Run], key: str, target: float, window: int, n_boot: int = 1000,
          seed: int = 0) -> Reach:  # fmt: skip
    """First step at which the smoothed mean curve over seeds reaches ``target``; its 95 % interval
    over seed resamples (percentiles of the reached resamples' steps)."""
    steps = common_steps(runs, key)

    def first(sample: Sequence[Run]) -> int | None:
        mean = [statistics.fmean(r.series[key][s] for r in sample) for s in steps]
        return first_reach(steps, smooth(mean, window), target)

    rng = random.Random(seed)
    draws = [first([runs[rng.randrange(len(runs))] for _ in runs]) for _ in range(n_boot)]
    hits = [d for d in draws if d is not None]
    lo = percentile(hits, 0.025) if hits else None
    hi = percentile(hits, 0.975) if hits else None
    return Reach(first(runs) if steps else None, lo, hi, len(hits) / n_boot)


# --- figures and report ---------------------------------------------------------------------------
def plot_metric(arms: dict[str, list[Run]], key: str, title: str, path: Path) -> Path | None:
    """Mean over seeds and its 95 % band against step, one line per arm (None: no arm logs it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn = False
    for name, runs in arms.items():
        steps, mean, half = band(runs, key)
        if not steps:
            continue
        drawn = True
        (line,) = ax.plot(steps, mean, label=f"{name} ({len(runs)} seed{'s' * (len(runs) > 1)})")
        lo = [m - h for m, h in zip(mean, half, strict=True)]
        hi = [m + h for m, h in zip(mean, half, strict=True)]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if not drawn:
        return None
    ax.set_title(f"{title} (mean, 95 % band over seeds)", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _f(x: float | None, d: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _pm(m: float, h: float, d: int = 3) -> str:
    return _f(m, d) if math.isnan(h) else f"{m:.{d}f} ± {h:.{d}f}"


def finals_section(arms: dict[str, list[Run]], window: int) -> list[str]:
    base_name, base = next(iter(arms.items()))
    keys = [(k, t) for k, t, _ in METRICS if any(common_steps(r, k) for r in arms.values())]
    lines = [
        f"## Final values (mean of the last {window} steps per seed; 95 % interval over seeds)",
        "",
    ]
    lines += ["| arm | seeds | " + " | ".join(t for _, t in keys) + " |"]
    lines += ["|---|---|" + "---|" * len(keys)]
    for name, runs in arms.items():
        cells = [_pm(*mean_ci(final_values(runs, k, window))) for k, _ in keys]
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    if len(arms) > 1:
        lines += ["", f"Difference to **{base_name}** (Welch's 95 % interval):", ""]
        lines += ["| arm | " + " | ".join(t for _, t in keys) + " |", "|---|" + "---|" * len(keys)]
        for name, runs in list(arms.items())[1:]:
            cells = []
            for k, _ in keys:
                a, b = final_values(runs, k, window), final_values(base, k, window)
                cells.append(_pm(*welch_diff_ci(a, b)) if a and b else "–")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def reach_section(arms: dict[str, list[Run]], key: str, target: float | None, window: int,
                  smooth_window: int) -> list[str]:  # fmt: skip
    base_name, base = next(iter(arms.items()))
    if not all(common_steps(r, key) for r in arms.values()):
        return []
    if target is None:
        target = statistics.fmean(final_values(base, key, window))
        what = f"{base_name}'s final {key} ({target:.4f})"
    else:
        what = f"{key} = {target}"
    lines = [f"## Steps to reach {what}", "",
             f"First step of the mean curve over seeds (smoothed over {smooth_window} steps) at or "
             "above the target; 95 % interval over seed resamples.", "",
             "| arm | steps | 95 % interval | resamples reaching |", "|---|---|---|---|"]  # fmt: skip
    for name, runs in arms.items():
        r = reach(runs, key, target, smooth_window)
        interval = "–" if r.low is None else f"{r.low} – {r.high}"
        lines.append(f"| {name} | {r.step if r.step is not None else 'not reached'} | {interval} "
                     f"| {r.reached:.2f} |")  # fmt: skip
    return lines + [""]


def paired_section(a_path: str, b_path: str, seed: int = 0) -> list[str]:
    """B against A on the prompts both answered: RM score and gold differences, win rates."""
    a, b = read_rows(a_path), read_rows(b_path)
    if not a or not b:
        raise ValueError(f"--results: {a_path if not a else b_path} has no rows")
    lines = [f"## {Path(b_path).name} against {Path(a_path).name} (paired by prompt)", "",
             "| | mean difference B − A | 95 % interval | prompts | win rate of B | 95 % interval |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for key, title in (("reward", "RM score"), ("gold", "gold")):
        mean, lo, hi, n = paired_gain(b, a, key=key, seed=seed)
        if n == 0:
            continue
        outcomes = rm_judged(b, a, key=key)
        wr, ci = win_rate(outcomes), bootstrap_ci(outcomes, seed=seed)
        ci_text = "–" if ci is None else f"{ci[0]:.3f} – {ci[1]:.3f}"
        lines.append(
            f"| {title} | {mean:+.4f} | {lo:+.4f} – {hi:+.4f} | {n} | {_f(wr)} | {ci_text} |"
        )
    if len(lines) == 4:
        scored = any(r.get(k) is not None for r in (*a, *b) for k in ("reward", "gold"))
        why = (
            "share no prompt with a reward or gold"
            if scored
            else "hold no reward or gold: no reward model scored them (marlhf infer without "
            "--reward_model_name_or_path, on a task without a gold score); compare their "
            "responses with marlhf judge, or sample them again with a reward model"
        )
        raise ValueError(f"--results: {a_path} and {b_path} {why}")
    return lines + ["", "Win rate counts a tie as half a win; intervals are percentile bootstraps "
                    "over the prompts.", ""]  # fmt: skip


@dataclass
class CompareConfig:
    """Runs to compare and what to report."""

    label: tuple[str, ...] = flag(
        (),
        "An arm's name, one per RUN argument (a glob's runs share it) or one per arm "
        "the runs make without labels; repeat the flag.",
        repeat=True,
    )
    output: str = flag("compare", "Directory of report.md and figures.")
    results: tuple[str, ...] = flag(
        (),
        "Two inference result files (A B): paired RM-score and gold differences "
        "and win rates of B over A.",
    )
    final_window: int = flag(5, "Steps averaged for a final value.")
    smooth_window: int = flag(5, "Smoothing of the curves for reach.")
    target_metric: str = flag("auto", "Metric of the reach table (auto: gold, else the score).")
    target: float | None = flag(None, "Target of the reach table (default: baseline's final).")
    seed: int = flag(0, "Seed of the bootstrap resamples.")

    def __post_init__(self) -> None:
        if self.results and len(self.results) != 2:
            raise ValueError(f"--results takes two files (A B), got {len(self.results)}")
        if self.final_window < 1 or self.smooth_window < 1:
            raise ValueError("--final_window and --smooth_window must be >= 1")


@dataclass
class CompareArgs:
    """All flags of marlhf compare."""

    compare: CompareConfig = field(default_factory=CompareConfig)


def compare(patterns: Sequence[str], cfg: CompareConfig) -> Path:
    """Write the report (and figures) of ``patterns`` under ``cfg.output``; returns report.md.
    Each row, value or run left out and each arm mixing steps or settings is warned about on
    stderr (``warning: ...``, naming the file and line) and in the report."""
    warnings: list[str] = []

    def warn(text: str) -> None:
        warnings.append(text)
        print(f"warning: {text}", file=sys.stderr)

    watched = {key for key, _, _ in METRICS}
    arms = arms_of(patterns, cfg.label, watched, warn) if patterns else {}
    if patterns and not arms:
        raise ValueError("no run has a complete row in its metrics.jsonl: nothing to compare")
    logged = [k for k, _, _ in METRICS if any(k in r.series for rs in arms.values() for r in rs)]
    if arms and not logged:
        names = ", ".join(k for k, _, _ in METRICS)
        raise ValueError(
            f"{', '.join(str(r.path) for rs in arms.values() for r in rs)}: no run logs a metric "
            f"marlhf compare reports ({names}); are these runs of marlhf sft, rm or ppo?"
        )
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Run comparison", ""]
    if arms:
        lines += [
            f"- **{n}**: " + ", ".join(f"`{r.path}`" for r in runs) for n, runs in arms.items()
        ]
        lines += ["", f"The first arm, **{next(iter(arms))}**, is the baseline.", ""]
        if warnings:
            lines += ["## Warnings", "", *(f"- {w}" for w in warnings), ""]
        for key, title, stem in METRICS:
            fig = plot_metric(arms, key, title, out / f"{stem}.png")
            if fig is not None:
                lines += [f"![{title}]({fig.name})", ""]
        lines += finals_section(arms, cfg.final_window)
        key = cfg.target_metric
        if key == "auto":
            has_gold = all(common_steps(r, "objective/gold") for r in arms.values())
            key = "objective/gold" if has_gold else "objective/score"
        lines += reach_section(arms, key, cfg.target, cfg.final_window, cfg.smooth_window)
    if cfg.results:
        lines += paired_section(*cfg.results, seed=cfg.seed)
    if not arms and not cfg.results:
        raise ValueError("nothing to compare: give run directories and/or --results A B")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags (see ``--help``), write the report, print its path."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(CompareArgs, (__doc__ or "").strip().splitlines()[0])
    parser.usage = "%(prog)s [-h] [--config FILE] [flags] RUN [RUN ...]"
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run directories or globs")
    ns = parser.parse_args(argv)
    runs = ns.runs
    del ns.runs
    args = config_from_namespace(CompareArgs, parser, ns)
    try:
        path = compare(runs, args.compare)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
