"""The comparison report of the embedded pipeline: policies scored on held-out prompts (reward model
and the synthetic task's gold score), an RM-judged pairwise win rate, macro-action statistics, and
training curves of each PPO run as PNG files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from marlhf.judge.stats import bootstrap_ci, win_rate
from marlhf.tracking import read_metrics


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def rm_judged(rows_a: list[dict], rows_b: list[dict], key: str = "reward") -> list[str]:
    """Pairwise outcomes by prompt_id: ``a`` when A's score is higher, ``b`` lower, ``tie`` equal."""
    by_id = {r["prompt_id"]: r for r in rows_b}
    out = []
    for r in rows_a:
        other = by_id.get(r["prompt_id"])
        if other is None or r.get(key) is None or other.get(key) is None:
            continue
        d = float(r[key]) - float(other[key])
        out.append("a" if d > 1e-9 else "b" if d < -1e-9 else "tie")
    return out


def plot_curves(run_dirs: dict[str, Path], path: Path) -> Path | None:
    """Reward-model score, gold score, KL and mean macro length against PPO step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("objective/score", "reward-model score"),
        ("objective/gold", "gold score (true quality)"),
        ("objective/kl", "KL(π‖π_ref) per response"),
        ("macro/mean_len", "mean macro-action length"),
    ]
    metrics = {}
    for name, d in run_dirs.items():
        f = d / "metrics.jsonl"
        if f.exists():
            metrics[name] = read_metrics(f)
    if not metrics:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for name, rows in metrics.items():
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, label=name, marker=".", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rm_accuracy(path: Path) -> float | None:
    """``eval_accuracy`` of a reward-model directory's reward_config.json (None if absent)."""
    try:
        value = json.loads(path.read_text()).get("eval_accuracy")
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _label_ceiling() -> float:
    """Fraction of the bundled held-out comparisons whose label agrees with the gold order: the
    best accuracy a reward model can reach against these labels."""
    from marlhf.data.synthetic import gold_score, prompt_of
    from marlhf.tiny import bundled_corpus_path

    hits = []
    with open(bundled_corpus_path()) as f:
        for line in f:
            row = json.loads(line) if line.strip() else None
            if row is None or row["split"] == "train":
                continue
            p = prompt_of(row)
            g0, g1 = (gold_score(p, s["text"]) for s in row["summaries"])
            if g0 != g1:
                hits.append((g0 > g1) == (row["choice"] == 0))
    return statistics.fmean(hits) if hits else float("nan")


def write_report(
    out: Path,
    results: dict[str, Path],
    run_dirs: dict[str, Path],
    ngram: int,
    reward_source: str = "rm",
) -> Path:
    rows = {name: _rows(p) for name, p in results.items() if p.exists()}
    rm_accuracy = _rm_accuracy(out / "rm" / "reward_config.json")
    lines = ["# ma-rlhf embedded pipeline: comparison report", ""]
    lines += [
        "Tiny Gemma-architecture model on the bundled synthetic TL;DR task (CPU). *RM score*: the trained",
        "reward model's end score; *gold*: the synthetic task's true quality of the summary",
        "(`marlhf.data.synthetic.gold_score`, which the policies never see).",
        "PPO's reward: "
        + (
            "the trained reward model."
            if reward_source == "rm"
            else "the gold score itself (`--reward_source gold`, an oracle), so RM scores are only "
            "diagnostics."
        ),
        *(
            [
                f"The reward model's held-out pairwise accuracy: {rm_accuracy:.3f} (the noisy labels "
                f"themselves agree with the gold order on {_label_ceiling():.3f} of the held-out "
                "pairs): a weak proxy, so a higher RM score need not mean a higher gold score."
            ]
            if rm_accuracy is not None
            else []
        ),
        "",
        "| policy | n | RM score (mean ± sd) | gold (mean ± sd) | response tokens | EOS rate |",
        "|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        rm = _mean_sd([float(r["reward"]) for r in rs if r.get("reward") is not None])
        gold = _mean_sd([float(r["gold"]) for r in rs if r.get("gold") is not None])
        length = _mean_sd([float(r.get("response_tokens", 0)) for r in rs])
        eos = (
            statistics.fmean(float(bool(r.get("ends_with_eos", False))) for r in rs)
            if rs
            else float("nan")
        )
        lines.append(
            f"| {name} | {len(rs)} | {rm[0]:.3f} ± {rm[1]:.3f} | {gold[0]:.3f} ± {gold[1]:.3f} | "
            f"{length[0]:.1f} | {eos:.2f} |"
        )
    if "mappo" in rows and "ppo" in rows:
        lines += ["", f"## MA-PPO (n={ngram}) vs PPO, pairwise on the same prompts", ""]
        for key, label in (("reward", "RM-judged"), ("gold", "gold-judged")):
            outcomes = rm_judged(rows["mappo"], rows["ppo"], key)
            if not outcomes:
                continue
            wr = win_rate(outcomes)
            ci = bootstrap_ci(outcomes, seed=0)
            w, t, l_ = (outcomes.count(x) for x in ("a", "tie", "b"))
            ci_text = f" (95% bootstrap CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else ""
            lines.append(
                f"- {label} win rate of MA-PPO: {wr:.2f}{ci_text}; wins {w} / ties {t} / losses {l_}"
            )
    lines += [
        "",
        "## Training runs",
        "",
        "| run | steps | final PPO reward | final gold | final KL | macro actions / response | mean macro length | s / step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, d in run_dirs.items():
        f = d / "metrics.jsonl"
        if not f.exists():
            continue
        ms = read_metrics(f)
        tail = ms[-5:]

        def avg(key: str, tail=tail) -> float:
            vals = [r[key] for r in tail if key in r]
            return statistics.fmean(vals) if vals else float("nan")

        lines.append(
            f"| {name} | {ms[-1]['step']} | {avg('objective/score'):.3f} | {avg('objective/gold'):.3f} | "
            f"{avg('objective/kl'):.3f} | {avg('macro/count'):.1f} | {avg('macro/mean_len'):.2f} | {avg('time/step'):.2f} |"
        )
    lines.append("")
    lines.append("(final = mean of the last 5 logged steps.)")
    png = plot_curves(run_dirs, out / "training_curves.png")
    if png is not None:
        lines += ["", f"![training curves]({png.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report
