"""The comparison report of the embedded pipeline: policies scored on held-out prompts (reward model
and the synthetic task's gold score) with 95 % intervals, the gold gain of each PPO run over SFT, a
degeneration statistic, the reward model's own quality, an RM-judged win rate, macro-action
statistics, stage wall times, and training curves of each PPO run as PNG files.

Statistics (all over the held-out prompts of one run, so they say how sure the figures are for THIS
run, not across training seeds):

- *gold [95 % CI]*: mean gold score with a percentile bootstrap interval over prompts;
- *Δ gold vs SFT*: mean of the per-prompt differences policy − SFT on the same prompts (paired), with
  a percentile bootstrap interval over prompts;
- *off-format openers*: the share of responses whose first word is not the task's opening word
  ("my": every fact of a summary is written "my <entity> <event> ...", so a complete summary starts
  with it). Junk openers ("tldr", "so", "3", an empty answer) are how the demo's PPO runs degenerated;
- *RM quality*: the RM's accuracy on ALL held-out comparisons against their (noisy) labels and
  against the gold order, and the Pearson r of its score with gold on the SFT policy's answers.

>>> first_word("  My sister borrowed my car"), first_word("tl;dr: so"), first_word("")
('my', 'tl', '')
>>> off_opener_share(["my dog ate it", "tldr my dog", "", "3 my"])
0.75
>>> bootstrap_mean_ci([1.0, 1.0, 1.0])
(1.0, 1.0)
>>> m, lo, hi, n = paired_gain([{"prompt_id": i, "gold": i + 1.0} for i in range(5)],
...                            [{"prompt_id": i, "gold": float(i)} for i in range(5)], "gold")
>>> m, lo, hi, n
(1.0, 1.0, 1.0, 5)
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from marlhf.data.long_tasks import TASKS as LONG_TASKS
from marlhf.data.long_tasks import answer_verdict, correct_verdict
from marlhf.data.synthetic import gold_score, prompt_of
from marlhf.judge.outcomes import bootstrap_ci, win_rate
from marlhf.models.zoo import bundled_corpus_path
from marlhf.runtime.tracking import read_metrics
from marlhf.stats import bootstrap_mean_ci, mean_sd, pearson

# The first word of every well-formed summary of the synthetic task (see the module docstring).
TASK_OPENER = "my"
_WORD = re.compile(r"[a-z0-9]+")


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def first_word(text: str) -> str:
    """The first lower-cased alphanumeric run of ``text`` ("" if none), as the gold scorer reads words."""
    m = _WORD.search(text.lower())
    return m.group(0) if m else ""


def off_opener_share(responses: Sequence[str], opener: str = TASK_OPENER) -> float:
    """Share of ``responses`` whose first word is not ``opener`` (an empty response counts)."""
    if not responses:
        return float("nan")
    return statistics.fmean(float(first_word(r) != opener) for r in responses)


def paired_gain(
    rows: list[dict], base_rows: list[dict], key: str = "gold", seed: int = 0
) -> tuple[float, float, float, int]:
    """``(mean, low, high, n)`` of ``row[key] - base[key]`` over the prompts both files answered
    (matched by ``prompt_id``), with a percentile bootstrap 95 % interval over those prompts."""
    base = {r["prompt_id"]: r for r in base_rows if r.get(key) is not None}
    diffs = [
        float(r[key]) - float(base[r["prompt_id"]][key])
        for r in rows
        if r.get(key) is not None and r["prompt_id"] in base
    ]
    if not diffs:
        return float("nan"), float("nan"), float("nan"), 0
    lo, hi = bootstrap_mean_ci(diffs, seed=seed)
    return statistics.fmean(diffs), lo, hi, len(diffs)


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


def rm_heldout_quality(ref_rows: list[dict]) -> dict[str, float]:
    """The RM's pairwise accuracy on scored comparisons (rows of ``inference --ref-scores``: chosen /
    rejected rewards and golds): against the labels (a tie counts half), against the gold order
    (pairs with equal gold left out), and the labels' own agreement with the gold order (the
    ceiling of the first)."""
    label_hits, gold_hits, ceiling = [], [], []
    for r in ref_rows:
        c, j = float(r["chosen_reward"]), float(r["rejected_reward"])
        label_hits.append(1.0 if c > j else 0.5 if c == j else 0.0)
        gc, gj = r.get("chosen_gold"), r.get("rejected_gold")
        if gc is not None and gj is not None and gc != gj:
            gold_hits.append(float((c > j) == (gc > gj)))
            ceiling.append(float(gc > gj))
    nan = float("nan")
    return {
        "pairs": float(len(label_hits)),
        "accuracy_vs_labels": statistics.fmean(label_hits) if label_hits else nan,
        "accuracy_vs_gold_order": statistics.fmean(gold_hits) if gold_hits else nan,
        "labels_vs_gold_order": statistics.fmean(ceiling) if ceiling else nan,
    }


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


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def is_verdict_task(task: str) -> bool:
    """Whether ``task`` is one of the ``synthetic-verdict-*`` tasks (an answer opens with a verdict)."""
    return task in LONG_TASKS and LONG_TASKS[task].family == "verdict"


def right_verdict_share(rows: Sequence[dict]) -> float:
    """Share of answers whose first fact blames the side of the post with more facts (the
    verdict task's opening decision, :func:`marlhf.data.long_tasks.correct_verdict`)."""
    if not rows:
        return float("nan")
    return statistics.fmean(
        float(answer_verdict(str(r.get("response", ""))) == correct_verdict(r["prompt"]))
        for r in rows
    )


def policy_stats(
    rows: dict[str, list[dict]], base: str = "sft", task: str = "synthetic-tldr"
) -> dict[str, dict]:
    """Per policy: n, RM score and gold (mean, sd), gold 95 % CI, paired gold gain over ``base``
    with its 95 % CI, off-format opener share (TL;DR) or right-verdict share (verdict tasks),
    response tokens and EOS rate (module docstring)."""
    out: dict[str, dict] = {}
    for name, rs in rows.items():
        golds = [float(r["gold"]) for r in rs if r.get("gold") is not None]
        st: dict = {
            "n": len(rs),
            "rm": mean_sd([float(r["reward"]) for r in rs if r.get("reward") is not None]),
            "gold": mean_sd(golds),
            "gold_ci": bootstrap_mean_ci(golds),
            "off_opener": off_opener_share([str(r.get("response", "")) for r in rs]),
            "tokens": mean_sd([float(r.get("response_tokens", 0)) for r in rs])[0],
            "eos": statistics.fmean(float(bool(r.get("ends_with_eos"))) for r in rs)
            if rs
            else float("nan"),
        }
        if is_verdict_task(task):
            st["right_verdict"] = right_verdict_share(rs)
        if name != base and base in rows:
            st["gain"] = paired_gain(rs, rows[base], "gold")
        out[name] = st
    return out


def _policy_table(stats: dict[str, dict], task: str = "synthetic-tldr") -> list[str]:
    verdict = is_verdict_task(task)
    share = "right verdicts" if verdict else f"openers ≠ “{TASK_OPENER}”"
    lines = [
        "| policy | n | RM score (mean ± sd) | gold (mean ± sd) | gold 95 % CI | Δ gold vs SFT "
        f"[95 % CI] | {share} | response tokens | EOS rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, st in stats.items():
        rm, gold, ci = st["rm"], st["gold"], st["gold_ci"]
        gain = st.get("gain")
        gain_text = f"{gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}]" if gain and gain[3] else "—"
        lines.append(
            f"| {name} | {st['n']} | {_fmt(rm[0])} ± {_fmt(rm[1])} | {_fmt(gold[0])} ± "
            f"{_fmt(gold[1])} | [{_fmt(ci[0])}, {_fmt(ci[1])}] | {gain_text} | "
            f"{st['right_verdict' if verdict else 'off_opener']:.0%} | {st['tokens']:.1f} | "
            f"{st['eos']:.2f} |"
        )
    return lines


def _rm_section(
    out: Path,
    rows: dict[str, list[dict]],
    ref_scores: Path | None,
    policy_pairs: Path | None,
    task: str = "synthetic-tldr",
) -> tuple[list, dict]:
    """Lines on the reward model's quality and the figures behind them."""
    quality: dict = {}
    if ref_scores is not None and ref_scores.exists():
        quality = rm_heldout_quality(_rows(ref_scores))
    sft = rows.get("sft", [])
    scored = [r for r in sft if r.get("reward") is not None and r.get("gold") is not None]
    if scored:
        quality["pearson_rm_gold_sft"] = pearson(
            [float(r["reward"]) for r in scored], [float(r["gold"]) for r in scored]
        )
    lines = ["", "## The reward model", ""]
    if "accuracy_vs_labels" in quality:
        lines.append(
            f"- held-out pairwise accuracy: {_fmt(quality['accuracy_vs_labels'])} against the labels "
            f"of all {int(quality['pairs'])} held-out comparisons (the noisy labels themselves agree "
            f"with the gold order on {_fmt(quality['labels_vs_gold_order'])} of them), "
            f"{_fmt(quality['accuracy_vs_gold_order'])} against the gold order;"
        )
    else:
        acc = _rm_accuracy(out / "rm" / "reward_config.json")
        if acc is not None and task == "synthetic-tldr":
            lines.append(
                f"- held-out pairwise accuracy (the RM stage's eval split): {acc:.3f} (the noisy "
                f"labels agree with the gold order on {_label_ceiling():.3f} of the held-out pairs);"
            )
    if "pearson_rm_gold_sft" in quality:
        lines.append(
            f"- Pearson r of its score with gold on the SFT policy's answers above: "
            f"{_fmt(quality['pearson_rm_gold_sft'])} ({len(scored)} answers)."
        )
    if policy_pairs is not None and policy_pairs.exists():
        with open(policy_pairs, encoding="utf-8") as f:
            quality["policy_pairs"] = sum(1 for line in f if line.strip())
        lines.append(
            f"- trained on the {'bundled' if task == 'synthetic-tldr' else 'task' + chr(39) + 's'} "
            f"comparisons and {quality['policy_pairs']} labelled "
            "comparisons of the SFT model's own answers to train prompts "
            f"(`{os.path.relpath(policy_pairs, out)}`; the RM stage's data split takes its share "
            "of them)."
        )
    return (lines if len(lines) > 3 else []), quality


def mappo_vs_ppo(rows: dict[str, list[dict]]) -> dict:
    """MA-PPO against PPO on the same prompts: the paired gold difference ``(mean, low, high, n)``
    and, judged by the RM and by gold, the win rate of MA-PPO with its 95 % bootstrap interval and
    its wins / ties / losses (empty when either is missing)."""
    if "mappo" not in rows or "ppo" not in rows:
        return {}
    out: dict = {"gold_gain": paired_gain(rows["mappo"], rows["ppo"], "gold")}
    for key in ("reward", "gold"):
        outcomes = rm_judged(rows["mappo"], rows["ppo"], key)
        if outcomes:
            ci = bootstrap_ci(outcomes, seed=0)
            out[f"{key}_win_rate"] = {
                "rate": win_rate(outcomes),
                "ci": list(ci) if ci else None,
                "wins_ties_losses": [outcomes.count(x) for x in ("a", "tie", "b")],
            }
    return out


def _pairwise_section(pairwise: dict, ngram: int) -> list[str]:
    if not pairwise:
        return []
    lines = ["", f"## MA-PPO (n={ngram}) vs PPO, pairwise on the same prompts", ""]
    gain = pairwise["gold_gain"]
    if gain[3]:
        lines.append(
            f"- Δ gold, MA-PPO − PPO (paired by prompt, 95 % bootstrap CI): {gain[0]:+.3f} "
            f"[{gain[1]:+.3f}, {gain[2]:+.3f}] over {gain[3]} prompts"
        )
    for key, label in (("reward", "RM-judged"), ("gold", "gold-judged")):
        if f"{key}_win_rate" not in pairwise:
            continue
        wr = pairwise[f"{key}_win_rate"]
        ci = wr["ci"]
        w, t, l_ = wr["wins_ties_losses"]
        ci_text = f" (95% bootstrap CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else ""
        lines.append(
            f"- {label} win rate of MA-PPO: {wr['rate']:.2f}{ci_text}; wins {w} / ties {t} / "
            f"losses {l_}"
        )
    return lines


def _training_table(run_dirs: dict[str, Path]) -> list[str]:
    lines = [
        "",
        "## Training runs",
        "",
        "| run | steps | final PPO reward | final gold | final KL | macro actions / response | "
        "mean macro length | s / step |",
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
            f"| {name} | {ms[-1]['step']} | {avg('objective/score'):.3f} | "
            f"{avg('objective/gold'):.3f} | {avg('objective/kl'):.3f} | {avg('macro/count'):.1f} | "
            f"{avg('macro/mean_len'):.2f} | {avg('time/step'):.2f} |"
        )
    return [*lines, "", "(final = mean of the last 5 logged steps.)"]


def _timings_section(
    timings: dict[str, float | None] | None, cpu_s: float | None = None, threads: int | None = None
) -> list[str]:
    if not timings:
        return []
    done = {k: v for k, v in timings.items() if v is not None}
    parts = [f"{k} {v:.0f} s" for k, v in done.items()]
    skipped = [k for k, v in timings.items() if v is None]
    text = "; ".join(parts) if parts else "none"
    if skipped:
        text += f" (skipped, already done: {', '.join(skipped)})"
    extra = ""
    if cpu_s is not None:
        extra += f" CPU time of these stages: {cpu_s:.0f} s"
        extra += f" ({threads} thread{'s' if threads > 1 else ''})." if threads else "."
    return ["", f"Stage wall times of this invocation: {text}.{extra}"]


def write_report(
    out: Path,
    results: dict[str, Path],
    run_dirs: dict[str, Path],
    ngram: int,
    reward_source: str = "rm",
    ref_scores: Path | None = None,
    timings: dict[str, float | None] | None = None,
    policy_pairs: Path | None = None,
    task: str = "synthetic-tldr",
    cpu_s: float | None = None,
    threads: int | None = None,
) -> Path:
    """Write ``out/report.md`` (and the figures as ``out/report.json``); returns the report's path."""
    rows = {name: _rows(p) for name, p in results.items() if p.exists()}
    stats = policy_stats(rows, task=task)
    pairwise = mappo_vs_ppo(rows)
    rm_lines, quality = _rm_section(out, rows, ref_scores, policy_pairs, task)
    if is_verdict_task(task):
        about = [
            f"Tiny Gemma-architecture models on the synthetic task `{task}` (CPU): the answer's",
            "first fact gives a verdict (it must blame the side of the post with more facts), then",
            "lists that side's facts; the score is paid at the end of the answer. *RM score*: the",
            "trained reward model's end score; *gold*: the task's true quality of the answer",
            "(`marlhf.data.long_tasks.verdict_gold`, which the policies never see); *right",
            "verdicts*: answers whose opening blames the right side. Intervals: percentile",
        ]
    else:
        about = [
            "Tiny Gemma-architecture models on the bundled synthetic TL;DR task (CPU). *RM score*: the",
            "trained reward model's end score; *gold*: the synthetic task's true quality of the summary",
            "(`marlhf.data.synthetic.gold_score`, which the policies never see). Intervals: percentile",
        ]
    lines = [
        "# ma-rlhf embedded pipeline: comparison report",
        "",
        *about,
        "bootstrap over the held-out prompts; Δ gold is paired by prompt (`marlhf.pipeline.report`).",
        "PPO's reward: "
        + (
            "the trained reward model."
            if reward_source == "rm"
            else "the gold score itself (`--reward_source gold`, an oracle), so RM scores are only "
            "diagnostics."
        ),
        "",
        *_policy_table(stats, task),
        *rm_lines,
        *_pairwise_section(pairwise, ngram),
        *_training_table(run_dirs),
        *_timings_section(timings, cpu_s, threads),
    ]
    png = plot_curves(run_dirs, out / "training_curves.png")
    if png is not None:
        lines += ["", f"![training curves]({png.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    figures = {
        "task": task,
        "policies": stats,
        "mappo_vs_ppo": pairwise,
        "reward_model": quality,
        "timings": timings or {},
        "cpu_s": cpu_s,
        "threads": threads,
    }
    (out / "report.json").write_text(json.dumps(figures, indent=1) + "\n")
    return report
