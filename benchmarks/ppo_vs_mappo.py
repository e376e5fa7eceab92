"""PPO vs MA-PPO on the bundled synthetic TL;DR task: does MA-PPO reach PPO's quality faster and end higher?

MA-RLHF (Chai et al., ICLR 2025) reports that MA-PPO reaches vanilla PPO's final quality 1.7-2x
faster in training and ends higher. This experiment measures the same thing on the embedded task,
whose *gold score* (``marlhf.data.synthetic.gold_score``) is the true quality of a summary:

    1. shared SFT and reward model, trained once (the demo's TL;DR flags, CPU-sized) and reused;
    2. PPO (fixed n=1, token level) and MA-PPO for each termination rule (fixed n=3/5/10, randomized,
       ppl, entropy with a target mean length of 5, parsing where a parser model is installed),
       each for ``--seeds`` seeds and the same number of PPO steps, all other settings equal;
    3. analysis: per-step gold / RM score / KL / macro length / time of every run into a CSV, a plot
       (mean over seeds with a 95 % t-interval band), and a markdown table with the final values
       (mean of the last ``--final_window`` steps, mean ± 95 % CI over seeds) and the paper's
       measure: the first step at which an arm's smoothed mean gold curve reaches PPO's final gold,
       and the speed-up ``PPO steps / that step``.

Every run is its own process (``python -m marlhf.stages.*``) and is skipped when its output exists,
so an interrupted experiment resumes. CPU (2 cores, the default ``--size cpu``)::

    .venv/bin/python benchmarks/ppo_vs_mappo.py --output_dir output/ppo_vs_mappo

On a GPU (same tiny model, larger rollouts, longer runs, more seeds)::

    python benchmarks/ppo_vs_mappo.py --size gpu --output_dir output/ppo_vs_mappo_gpu

Only analyse existing runs: ``--analyze_only``. Subsets: ``--arms ppo,fixed5 --seeds 1,2,3 --steps 20``.

The critic-free estimators are arms too (``grpo``, ``grpo_macro5``, ``macro_mc5``; on
request ``dr_grpo``, ``rloo``, ``reinforce_pp``, ``gspo``), with the cost per step in a second table;
``vf_{equal,position,unit,start}5`` compare the macro value weightings, ``mc_cost{1,3,5,10}`` the
cost of ``macro_mc`` against the macro length. ``--eval_prompts 128`` samples held-out prompts from
each run's actor after training (junk-opener rate, gold, RM score; docs/results.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.analysis import (  # noqa: E402, F401 - re-exported for tests and callers
    BASELINE,
    ArmSummary,
    final_value,
    first_reach,
    load_run,
    mean_curve,
    pm,
    smooth,
    speedup,
    summarize,
)
from marlhf.pipeline.demo_settings import PPO_FLAGS, RM_FLAGS, SFT_FLAGS  # noqa: E402
from marlhf.stats import mean_ci, welch_diff_ci  # noqa: E402

# --------------------------------------------------------------------------------------------------
# arms and sizes

# Arm name -> the macro-action flags of its PPO run (everything else is shared). `ppo` is
# token-level PPO exactly (fixed n=1 reproduces it, tests/ppo says so).
ARMS: dict[str, list[str]] = {
    "ppo": ["--termination_condition", "fixed", "--ngram", "1"],
    "fixed3": ["--termination_condition", "fixed", "--ngram", "3"],
    "fixed5": ["--termination_condition", "fixed", "--ngram", "5"],
    "fixed10": ["--termination_condition", "fixed", "--ngram", "10"],
    "randomized": ["--termination_condition", "randomized"],
    "ppl": ["--termination_condition", "ppl"],
    "entropy": ["--termination_condition", "entropy", "--target_macro_len", "5"],
    "parsing": [
        "--termination_condition",
        "parsing",
        "--parser_backend",
        "spacy",
        "--spacy_model",
        "en_core_web_sm",
    ],
}
# Critic-free estimators, same rollout size (16 responses = 4 prompts x G = 4 samples)
# and all other settings shared: GRPO at the token level (fixed n=1 only fixes the logging), GRPO
# with the macro-action ratio over fixed 5-grams, and Monte-Carlo credit per macro action (n=5; K=4
# continuations at <= 4 boundaries per response; V(prompt) = the group's leave-one-out mean).
_GROUP = ["--n_samples_per_prompt", "4"]
ARMS.update(
    {
        "grpo": ["--termination_condition", "fixed", "--ngram", "1",
                 "--advantage_estimator", "grpo", *_GROUP],
        "grpo_macro5": ["--termination_condition", "fixed", "--ngram", "5",
                        "--advantage_estimator", "grpo", *_GROUP, "--ratio_level", "macro"],
        "macro_mc5": ["--termination_condition", "fixed", "--ngram", "5",
                      "--advantage_estimator", "macro_mc", *_GROUP,
                      "--mc_rollouts", "4", "--mc_max_boundaries", "4"],
    }
)  # fmt: skip
# Arms run only when named in --arms.
EXTRA_ARMS: dict[str, list[str]] = {
    # the other critic-free estimators
    "dr_grpo": ["--termination_condition", "fixed", "--ngram", "1",
                "--advantage_estimator", "dr_grpo", *_GROUP],
    "rloo": ["--termination_condition", "fixed", "--ngram", "1",
             "--advantage_estimator", "rloo", *_GROUP],
    "reinforce_pp": ["--termination_condition", "fixed", "--ngram", "1",
                     "--advantage_estimator", "reinforce_pp"],
    "gspo": ["--termination_condition", "fixed", "--ngram", "1", "--advantage_estimator", "grpo",
             *_GROUP, "--ratio_level", "sequence", "--loss_agg_mode", "seq-mean-token-mean"],
    # MA-PPO (fixed n=5) with each macro value weighting (`equal` is `fixed5`)
    **{
        f"vf_{vf}5": ["--termination_condition", "fixed", "--ngram", "5", "--value_function", vf]
        for vf in ("equal", "position", "unit", "start")
    },
    # the cost of macro_mc against the macro-action length, at one cap (8 boundaries per response)
    **{
        f"mc_cost{n}": ["--termination_condition", "fixed", "--ngram", str(n),
                        "--advantage_estimator", "macro_mc", *_GROUP,
                        "--mc_rollouts", "4", "--mc_max_boundaries", "8"]
        for n in (1, 3, 5, 10)
    },
}  # fmt: skip
ALL_ARMS = {**ARMS, **EXTRA_ARMS}


@dataclass(frozen=True)
class Size:
    """Steps, seeds and per-stage flag overrides of one experiment size."""

    steps: int
    seeds: tuple[int, ...]
    jobs: int  # PPO processes at once
    threads: int  # OMP threads per process
    sft: dict[str, str]
    rm: dict[str, str]
    ppo: dict[str, str]
    cpu: bool  # force DeepSpeed's CPU accelerator


SIZES = {
    # 2 CPU cores: one PPO step of the demo settings (16 prompts x 40 tokens) took 0.7-1.8 s per
    # process (1 thread, two processes side by side) plus ~10 s of start-up per run (measured, see
    # docs/research/ma-ppo-vs-ppo.md), so 7 arms x 4 seeds x 80 steps is about 25 min of wall time.
    "cpu": Size(steps=80, seeds=(1, 2, 3, 4), jobs=2, threads=1, sft={}, rm={}, ppo={}, cpu=True),
    # One GPU: the same tiny model (nothing can be downloaded) with 4x larger rollouts, longer
    # answers, more steps and seeds; several small runs share the GPU.
    "gpu": Size(
        steps=300,
        seeds=(1, 2, 3, 4, 5),
        jobs=4,
        threads=2,
        sft={"--per_device_train_batch_size": "32"},
        rm={"--per_device_train_batch_size": "32"},
        ppo={
            "--per_device_generation_batch_size": "64",
            "--per_device_training_batch_size": "16",
            "--max_answer_seq_len": "48",
        },
        cpu=False,
    ),
}


def with_overrides(flags: Sequence[str], overrides: dict[str, str]) -> list[str]:
    """``flags`` (``--name value`` pairs) with the values of ``overrides`` replaced or appended."""
    out = list(flags)
    for name, value in overrides.items():
        if name in out:
            out[out.index(name) + 1] = value
        else:
            out += [name, value]
    return out


def parser_available() -> bool:
    """Whether the `parsing` arm can run on prose here: a spaCy English pipeline is installed."""
    try:
        import spacy.util
    except ImportError:
        return False
    return bool(spacy.util.is_package("en_core_web_sm"))


# --------------------------------------------------------------------------------------------------
# tables (the statistics are in benchmarks/analysis.py, shared with horizon_sweep.py)

_pm = pm


def markdown_table(rows: Sequence[ArmSummary], baseline: str = BASELINE) -> str:
    """The results table (markdown)."""
    lines = [
        "| arm | seeds | steps | final gold | Δ gold vs PPO | final PPO reward | final KL | "
        "mean macro len | s / step | reaches PPO's final gold at step | speed-up | seeds reaching |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        # the baseline's own reach step says where PPO's curve flattens (context for the others)
        is_base = r.arm == baseline
        reach = "not reached" if r.reach_step is None else str(r.reach_step)
        sp = "—" if is_base or r.speedup is None else f"{r.speedup:.2f}×"
        seeds = f"{r.seeds_reached}/{r.n_seeds}"
        delta = "—" if is_base else _pm(r.gold_vs_ppo)
        lines.append(
            f"| {r.arm} | {r.n_seeds} | {r.steps} | {_pm(r.gold)} | {delta} | {_pm(r.score)} | "
            f"{_pm(r.kl)} | {r.macro_len:.2f} | {r.step_time:.2f} | {reach} | {sp} | {seeds} |"
        )
    return "\n".join(lines)


def _finite_mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(xs) if xs else float("nan")


def cost_table(runs: dict[str, dict[int, dict[str, list[float]]]]) -> str:
    """The cost per step of every arm (markdown): s / step (mean over its steps, then mean ± 95 %
    CI over seeds), macro length, and for macro_mc the seconds of the continuations per step, their
    number and the boundaries per response.

    >>> run = {"step_time": [1.0, 3.0], "macro_len": [5.0, 5.0], "mc_time": [0.5, 1.5],
    ...        "mc_continuations": [64.0, 32.0], "mc_boundaries": [1.0, 0.5]}
    >>> print(cost_table({"mc": {1: run}}).splitlines()[-1])
    | mc | 1 | 5.00 | 2.000 | 1.000 (50 %) | 48.0 | 0.75 |
    """
    lines = [
        "| arm | seeds | mean macro len | s / step | MC s / step (share) | continuations / step "
        "| MC boundaries / response |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, seeds in runs.items():
        per_seed = {
            k: [_finite_mean(m.get(k, [])) for m in seeds.values()]
            for k in ("step_time", "macro_len", "mc_time", "mc_continuations", "mc_boundaries")
        }
        step = mean_ci(per_seed["step_time"])
        mc_time = _finite_mean(per_seed["mc_time"])
        share = "—" if math.isnan(mc_time) else f"{mc_time:.3f} ({100 * mc_time / step[0]:.0f} %)"
        conts, bounds = (
            _finite_mean(per_seed["mc_continuations"]),
            _finite_mean(per_seed["mc_boundaries"]),
        )
        lines.append(
            f"| {arm} | {len(seeds)} | {_finite_mean(per_seed['macro_len']):.2f} | {_pm(step)} | "
            f"{share} | {'—' if math.isnan(conts) else f'{conts:.1f}'} | "
            f"{'—' if math.isnan(bounds) else f'{bounds:.2f}'} |"
        )
    return "\n".join(lines)


def junk_opener(response: str) -> bool:
    """Whether a summary does not open with the task's first word, "my" (the synthetic TL;DRs all
    start "my ..."; junk openers are "tldr", "so", "3", ...).

    >>> junk_opener("My dog ate it"), junk_opener(" so my dog"), junk_opener("")
    (False, True, True)
    """
    words = response.split()
    return not words or words[0].strip(".,;:!?\"'").lower() != "my"


def eval_summary(rows: Sequence[dict]) -> dict[str, float]:
    """Junk-opener rate, mean gold and mean reward-model score of one run's held-out samples.

    >>> eval_summary([{"response": "my a", "gold": 1.0, "reward": 0.5},
    ...               {"response": "tldr my", "gold": 0.0, "reward": 1.5}])
    {'junk': 0.5, 'gold': 0.5, 'rm': 1.0, 'n': 2}
    """
    return {
        "junk": statistics.fmean(junk_opener(r["response"]) for r in rows),
        "gold": statistics.fmean(float(r["gold"]) for r in rows),
        "rm": statistics.fmean(float(r["reward"]) for r in rows),
        "n": len(rows),
    }


def eval_table(evals: dict[str, dict[int, dict[str, float]]], baseline: str = BASELINE) -> str:
    """The after-training table (markdown): per arm, mean ± 95 % CI over seeds of the junk-opener
    rate, gold and RM score, the per-seed junk rates, and Welch's difference of gold to the
    baseline."""
    lines = [
        "| arm | seeds | junk-opener rate | per seed | gold | Δ gold vs PPO | RM score |",
        "|---|---|---|---|---|---|---|",
    ]
    base_gold = [e["gold"] for e in evals.get(baseline, {}).values()]
    for arm, seeds in evals.items():
        junk = [e["junk"] for _, e in sorted(seeds.items())]
        gold = [e["gold"] for e in seeds.values()]
        delta = "—" if arm == baseline or not base_gold else _pm(welch_diff_ci(gold, base_gold))
        lines.append(
            f"| {arm} | {len(seeds)} | {_pm(mean_ci(junk), 2)} | "
            f"{' / '.join(f'{j:.2f}' for j in junk)} | {_pm(mean_ci(gold))} | {delta} | "
            f"{_pm(mean_ci([e['rm'] for e in seeds.values()]))} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# reading runs, CSV, plot

CSV_COLUMNS = (
    "arm",
    "seed",
    "step",
    "gold",
    "rm_score",
    "kl",
    "macro_mean_len",
    "step_time_s",
    "elapsed_s",
)


def write_csv(runs: dict[str, dict[int, dict[str, list[float]]]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for arm, seeds in runs.items():
            for seed, m in sorted(seeds.items()):
                for i, step in enumerate(m["step"]):
                    w.writerow(
                        [
                            arm,
                            seed,
                            int(step),
                            *(
                                f"{m[k][i]:.6g}"
                                for k in (
                                    "gold",
                                    "score",
                                    "kl",
                                    "macro_len",
                                    "step_time",
                                    "elapsed",
                                )
                            ),
                        ]
                    )


def plot(
    runs: dict[str, dict[int, dict[str, list[float]]]], path: Path, smooth_window: int
) -> Path:
    """Gold and RM score against PPO step: smoothed mean over seeds, 95 % t-interval band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("gold", "gold score (true quality)"), ("score", "PPO reward (RM score, or gold)")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for arm, seeds in runs.items():
            curves = [smooth(m[key], smooth_window) for m in seeds.values()]
            n = min(len(c) for c in curves)
            stats = [mean_ci([c[i] for c in curves]) for i in range(n)]
            xs = list(range(1, n + 1))
            mean = [s[0] for s in stats]
            half = [0.0 if math.isnan(s[1]) else s[1] for s in stats]
            style = {"color": "black", "linewidth": 2.0} if arm == BASELINE else {"linewidth": 1.2}
            (line,) = ax.plot(xs, mean, label=arm, **style)
            ax.fill_between(
                xs,
                [m - h for m, h in zip(mean, half, strict=True)],
                [m + h for m, h in zip(mean, half, strict=True)],
                color=line.get_color(),
                alpha=0.12,
                linewidth=0,
            )
        ax.set_title(f"{title}, mean of seeds ± 95% CI", fontsize=10)
        ax.set_xlabel(f"PPO step (trailing mean over {smooth_window})")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------
# running the stages


def _env(size: Size) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(size.threads)
    env["MKL_NUM_THREADS"] = str(size.threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    if size.cpu:
        env["DS_ACCELERATOR"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(title: str, args: list[str], done: Path, log_file: Path, env: dict[str, str]) -> float:
    """Run ``python args`` unless ``done`` exists; returns its wall time (0 when skipped)."""
    if done.exists():
        print(f"[exp] {title}: already done ({done}), skipped", flush=True)
        return 0.0
    print(f"[exp] {title} ...", flush=True)
    t0 = time.time()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as log:
        proc = subprocess.run(
            [sys.executable, *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    if proc.returncode != 0:
        tail = "".join(open(log_file).readlines()[-30:])
        raise RuntimeError(f"{title} failed (exit {proc.returncode}); log {log_file}:\n{tail}")
    dt = time.time() - t0
    print(f"[exp] {title}: done in {dt:.0f}s", flush=True)
    return dt


def ppo_args(
    out: Path, arm: str, seed: int, steps: int, size: Size, common: list[str]
) -> list[str]:
    """The ``marlhf.stages.ppo`` command line of one run (arm, seed)."""
    return [
        "-m",
        "marlhf.stages.ppo",
        *with_overrides(PPO_FLAGS, size.ppo),
        *common,
        *ALL_ARMS[arm],
        "--seed",
        str(seed),
        "--actor_model_name_or_path",
        str(out / "sft"),
        "--critic_model_name_or_path",
        str(out / "rm"),
        "--max_steps",
        str(steps),
        # enough passes over the prompts for any --steps; the LR schedule is constant
        "--num_train_epochs",
        "100",
        "--output_dir",
        str(run_dir(out, arm, seed)),
    ]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / arm / f"seed{seed}"


def eval_args(out: Path, arm: str, seed: int, n_prompts: int) -> list[str]:
    """Sampling ``n_prompts`` held-out prompts at T=1 from one run's actor, scored by the reward
    model and the gold scorer (``inference/inference_with_rewards.py``)."""
    d = run_dir(out, arm, seed)
    return [
        str(ROOT / "inference" / "inference_with_rewards.py"),
        "--proj_path", str(out), "--dataset", "synthetic",
        "--model", str(d / "actor"), "--reward_model", str(out / "rm"),
        "--num_samples", str(n_prompts), "--batch_size", "32", "--max_new_tokens", "40",
        "--max_prompt_len", "160", "--temperature", "1.0", "--top_k", "0", "--seed", "1234",
        "--disable_progress_bar", "--output", str(d / "eval.jsonl"),
    ]  # fmt: skip


def collect_evals(
    out: Path, arms: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[int, dict[str, float]]]:
    """The after-training summaries of the runs that have one (``eval.jsonl``)."""
    evals: dict[str, dict[int, dict[str, float]]] = {}
    for arm in arms:
        for seed in seeds:
            f = run_dir(out, arm, seed) / "eval.jsonl"
            if f.exists():
                rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
                evals.setdefault(arm, {})[seed] = eval_summary(rows)
    return evals


def stage_args(out: Path, size: Size, model: str, common: list[str]) -> dict[str, list[str]]:
    """The SFT and reward-model command lines (shared by every run, data seed 1234)."""
    shared = [*common, "--seed", "1234"]
    return {
        "sft": [
            "-m",
            "marlhf.stages.sft",
            *with_overrides(SFT_FLAGS, {"--model_name_or_path": model, **size.sft}),
            *shared,
            "--output_dir",
            str(out / "sft"),
        ],
        "rm": [
            "-m",
            "marlhf.stages.reward",
            *with_overrides(RM_FLAGS, size.rm),
            *shared,
            "--model_name_or_path",
            str(out / "sft"),
            "--output_dir",
            str(out / "rm"),
        ],
    }


def collect(
    out: Path, arms: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[int, dict[str, list[float]]]]:
    runs: dict[str, dict[int, dict[str, list[float]]]] = {}
    for arm in arms:
        for seed in seeds:
            f = run_dir(out, arm, seed) / "metrics.jsonl"
            if f.exists():
                runs.setdefault(arm, {})[seed] = load_run(f)
    return runs


def analyze(
    out: Path,
    arms: Sequence[str],
    seeds: Sequence[int],
    final_window: int,
    smooth_window: int,
    plot_path: Path | None,
) -> str:
    runs = collect(out, arms, seeds)
    if BASELINE not in runs:
        raise SystemExit(f"no finished `{BASELINE}` runs under {out / 'runs'}: nothing to compare")
    write_csv(runs, out / "curves.csv")
    rows = summarize(runs, final_window=final_window, smooth_window=smooth_window)
    table = markdown_table(rows)
    png = plot(runs, plot_path or out / "ppo_vs_mappo.png", smooth_window)
    text = (
        f"{table}\n\nfinal = mean of the last {final_window} steps of each seed, then mean ± 95% "
        f"t-interval over seeds; reach step on the trailing-{smooth_window} mean-over-seeds gold "
        f"curve; speed-up = PPO steps / reach step.\n\nCost per step (all steps):\n\n"
        f"{cost_table(runs)}\n\nCSV: {out / 'curves.csv'}\nplot: {png}\n"
    )
    evals = collect_evals(out, arms, seeds)
    if evals:
        n = next(iter(next(iter(evals.values())).values()))["n"]
        text += (
            f"\nAfter training: {n} held-out prompts sampled at T=1 per run; junk opener = first "
            f"word not 'my'; mean ± 95% t-interval over seeds.\n\n{eval_table(evals)}\n"
        )
    (out / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", choices=tuple(SIZES), default="cpu")
    ap.add_argument("--output_dir", default="output/ppo_vs_mappo")
    ap.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated arms: by default {','.join(ARMS)}; also {','.join(EXTRA_ARMS)} "
        f"(`{BASELINE}` is always run)",
    )
    ap.add_argument("--seeds", default=None, help="comma-separated PPO seeds (default: per size)")
    ap.add_argument("--steps", type=int, default=None, help="PPO steps per run (default: per size)")
    ap.add_argument("--jobs", type=int, default=None, help="PPO runs at once (default: per size)")
    ap.add_argument(
        "--model_name_or_path",
        default="tiny-base",
        help="base model of SFT (default: the shipped pretrained tiny model)",
    )
    ap.add_argument(
        "--reward_source",
        choices=("gold", "rm"),
        default="gold",
        help="PPO's reward: the task's gold score (an oracle: compares the RL algorithms without "
        "the reward model's errors; default) or the learned reward model",
    )
    ap.add_argument("--final_window", type=int, default=5, help="steps averaged for final values")
    ap.add_argument("--smooth_window", type=int, default=5, help="trailing smoothing of curves")
    ap.add_argument("--plot", default=None, help="PNG path (default: OUTPUT_DIR/ppo_vs_mappo.png)")
    ap.add_argument("--analyze_only", action="store_true", help="only analyse existing runs")
    ap.add_argument(
        "--eval_prompts",
        type=int,
        default=0,
        help="after training, sample this many held-out prompts at T=1 from each run's actor "
        "(junk-opener rate, gold, RM score); 0: off",
    )
    args = ap.parse_args(argv)

    size = SIZES[args.size]
    steps = args.steps or size.steps
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(size.seeds)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ALL_ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; choose from {list(ALL_ARMS)}")
    if BASELINE not in arms:
        arms.insert(0, BASELINE)
    if "parsing" in arms and not parser_available():
        print(
            "[exp] parsing arm skipped: no spaCy English pipeline (en_core_web_sm) or benepar "
            "model is installed, and the `python` backend is for code, not prose",
            flush=True,
        )
        arms.remove("parsing")
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)

    if not args.analyze_only:
        env = _env(size)
        # one data split for every run (--seed varies only the RL randomness)
        common = [
            "--data_output_path",
            str(out / "data_cache"),
            "--data_seed",
            "1234",
            "--disable_progress_bar",
        ]
        t_start = time.time()
        # 1. shared SFT and reward model
        stages = stage_args(out, size, args.model_name_or_path, common)
        _run("SFT", stages["sft"], out / "sft" / "model.safetensors", out / "logs" / "sft.log", env)
        _run("RM", stages["rm"], out / "rm" / "reward_config.json", out / "logs" / "rm.log", env)
        # 2. every (arm, seed), seed-major so partial results cover every arm
        reward = args.reward_source
        jobs = [(arm, seed) for seed in seeds for arm in arms]

        def one(job: tuple[str, int]) -> str | None:
            arm, seed = job
            try:
                _run(
                    f"{arm} seed {seed}",
                    [*ppo_args(out, arm, seed, steps, size, common), "--reward_source", reward],
                    run_dir(out, arm, seed) / "actor" / "model.safetensors",
                    out / "logs" / f"{arm}_seed{seed}.log",
                    env,
                )
            except RuntimeError as e:  # one failed arm must not stop the others
                print(f"[exp] {e}", flush=True)
                return f"{arm} seed {seed}"
            return None

        def evaluate(job: tuple[str, int], n_prompts: int) -> str | None:
            arm, seed = job
            d = run_dir(out, arm, seed)
            try:
                _run(
                    f"eval {arm} seed {seed}",
                    eval_args(out, arm, seed, n_prompts),
                    d / "eval.jsonl.summary.json",
                    out / "logs" / f"eval_{arm}_seed{seed}.log",
                    env,
                )
            except RuntimeError as e:
                print(f"[exp] {e}", flush=True)
                return f"eval {arm} seed {seed}"
            return None

        with ThreadPoolExecutor(max_workers=args.jobs or size.jobs) as pool:
            failed = [f for f in pool.map(one, jobs) if f]
            if args.eval_prompts > 0:
                evals = [job for job in jobs if f"{job[0]} seed {job[1]}" not in failed]
                failed += [
                    f for f in pool.map(lambda j: evaluate(j, args.eval_prompts), evals) if f
                ]
        print(f"[exp] all runs: {time.time() - t_start:.0f}s wall; failed: {failed or 'none'}")

    print(
        analyze(
            out,
            arms,
            seeds,
            args.final_window,
            args.smooth_window,
            Path(args.plot).resolve() if args.plot else None,
        )
    )


if __name__ == "__main__":
    main()
