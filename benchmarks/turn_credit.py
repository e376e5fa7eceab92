"""Turn-level credit on the trail task (``marlhf-trail-N``): does a turn as one macro action reach
token-level PPO's gold sooner, and end higher, when each arm runs at its own best setting?

The task (``marlhf/data/trail.py``, docs/guide/agents.md): the first call of an N-turn game decides
whether the last turn can name the right holder, and the reward (1 or 0) comes at the end, so credit
for the decision has N turns (and ~5 N tokens) to travel. The shipped base ``tiny-base-trail``
follows the format and is unsure of its first call.

Pre-registered (docs/research/agents.md, written before any run of this script):

- Arms (one flag set each, :data:`ARMS`): ``ppo`` (token-level GAE, ``--ngram 1``), ``turn``
  (``--termination_condition turn``: GAE over turns), ``grpo`` (whole episodes compared in groups
  of 4) and ``mt_grpo`` (MT-GRPO's per-turn group-relative advantages, groups of 4). With
  ``--max_answer_seq_len 8`` no action is longer than 8 tokens, so fixed 10-token macro actions
  inside turns are the ``turn`` arm and are not run apart. (Added after the main cell's runs,
  with its own pre-registration in docs/research/agents.md, "Further cells": the arm ``macro_mc``,
  Monte-Carlo values at every turn start from the environment replayed by re-running its steps,
  named with ``--arms``; a per-turn reward cell, ``--env_config '{"step_reward": 0.1}'``; and
  ``--turns 8``.)
- Tuning (``--tune``): every arm on the same grid, GAE's λ ∈ {0.95, 1} (the critic arms; the
  critic-free ones have no λ) × actor learning rate ∈ {1e-4, 2e-4}, on tuning seeds 1-3; each arm
  keeps its best setting by :func:`benchmarks.tuning.choose` on the selection score of
  :mod:`benchmarks.tuning` (the mean over seeds of (final training gold + held-out gold) / 2).
- Report: the chosen settings on seeds 11-20 (:data:`REPORT_SEEDS`). Per arm: final training gold
  (the mean of the last 5 steps' ``env/gold``, the final reward alone; ``env/return`` with no
  per-turn reward, where the two are the same), held-out
  gold on 200 ``valid`` games at T = 1 and greedy, the share of right first calls; differences to
  ``ppo`` with Welch's 95 % interval over seeds; MA-RLHF's speed-up (the first step at which an
  arm's smoothed mean curve reaches ``ppo``'s final training gold, ``ppo``'s steps over it) with a
  seed bootstrap; the λ = 1 control is the tuning table itself (every critic arm at both λ).
  Below it, outside the registered figures, :func:`curve_table`: each arm's training gold by
  tenths of the run and its mean over the run, with the difference to ``ppo``.
- Settings: ``marlhf-trail-4``, 60 steps of 16 games, critic lr 5e-4, ``--kl_ctl 0.01``, T = 1,
  one PPO epoch in minibatches of 8, constant learning rates.

Each run is a ``python -m marlhf.stages.ppo`` process (its directory under ``--output_dir`` holds
``metrics.jsonl``, the actor, and ``eval.json`` with the held-out figures); a finished run (with its
``eval.json``) is skipped, so the same command resumes. ``--analyze_only`` prints the tables from what
is there.

    python benchmarks/turn_credit.py --tune --output_dir output/turn_credit   # tuning, then report
    python benchmarks/turn_credit.py --tune --tune_only ...                   # the tuning phase only

Cost on one CPU thread: about 32 CPU s a run's stage (60 steps of 16 four-turn games, start-up
included) plus its held-out games; the 36 tuning runs took 43 min wall with one worker beside other
jobs. ``--size gpu`` runs 64 games a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.analysis import (  # noqa: E402
    bootstrap_speedup,
    final_value,
    first_reach,
    last_rows,
    mean_curve,
    pm,
    smooth,
)
from benchmarks.analysis import speedup as speedup_of  # noqa: E402
from benchmarks.tuning import (  # noqa: E402
    TUNE_LRS,
    TUNE_SEEDS,
    Setting,
    arm_grid,
    choose,
    selection_score,
)
from marlhf.stats import mean_ci, welch_diff_ci  # noqa: E402

# Monte-Carlo values at every turn start (--mc_max_boundaries N - 1 on the N-turn task, by
# arm_flags): K = 4 continuations each, the environment replayed by re-running the steps
MC_ARM = [
    "--termination_condition", "turn", "--advantage_estimator", "macro_mc",
    "--n_samples_per_prompt", "4", "--mc_rollouts", "4", "--mc_boundary_selection", "spread",
]  # fmt: skip
ARMS: dict[str, list[str]] = {
    "ppo": ["--termination_condition", "fixed", "--ngram", "1"],
    "turn": ["--termination_condition", "turn"],
    "grpo": ["--advantage_estimator", "grpo", "--n_samples_per_prompt", "4"],
    "mt_grpo": ["--advantage_estimator", "mt_grpo", "--n_samples_per_prompt", "4"],
    "macro_mc": MC_ARM,
}
# the arms of the pre-registered main cell (the default of --arms); macro_mc is its own cell
REGISTERED_ARMS = ("ppo", "turn", "grpo", "mt_grpo")
TUNE_LAMS = (0.95, 1.0)
REPORT_SEEDS = tuple(range(11, 21))
FINAL_WINDOW = 5
SMOOTH_WINDOW = 5
HELD_OUT = 200


@dataclass(frozen=True)
class Size:
    """How large a run is: steps, games a step, held-out games."""

    steps: int
    rollouts: int
    held_out: int


SIZES = {"cpu": Size(60, 16, HELD_OUT), "gpu": Size(200, 64, 1000), "smoke": Size(2, 8, 8)}


def settings_of(arm: str, lams=TUNE_LAMS, lrs=TUNE_LRS) -> list[Setting]:
    """The grid of ``arm`` in its order (λ, then learning rate); one λ for a critic-free arm
    (:func:`benchmarks.tuning.arm_grid`).

    >>> [s.label for s in settings_of("grpo", (0.95, 1.0), (1e-4,))]
    ['λ=1, lr=1e-04']
    """
    return arm_grid(ARMS[arm], lams, lrs)


def arm_flags(arm: str, turns: int) -> list[str]:
    """The flags of ``arm`` on the ``turns``-turn task: ``macro_mc`` gets ``--mc_max_boundaries
    turns - 1``, so `spread` chooses every turn start after the first of every episode (all of
    them, whatever the episode's length: no selection that depends on the episode).

    >>> arm_flags("macro_mc", 8)[-2:]
    ['--mc_max_boundaries', '7']
    """
    flags = list(ARMS[arm])
    return flags + ["--mc_max_boundaries", str(turns - 1)] if arm == "macro_mc" else flags


def run_dir(out: Path, turns: int, arm: str, s: Setting, seed: int) -> Path:
    """``out/trail4/turn/lam0.95_lr1e-04/seed11``"""
    return out / f"trail{turns}" / arm / f"lam{s.lam:g}_lr{s.lr:.0e}" / f"seed{seed}"


def stage_command(
    run: Path, turns: int, arm: str, s: Setting, seed: int, size: Size, env_config: str | None
) -> list[str]:
    """The stage-3 command of one run."""
    task = f"marlhf-trail-{turns}"
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo",
        "--actor_model_name_or_path", "tiny-base-trail",
        "--critic_model_name_or_path", "tiny-base-trail",
        "--env", task, "--data_path", task,
        "--max_answer_seq_len", "8", "--max_total_seq_len", str(32 + 20 * turns),
        "--temperature", "1.0", "--top_k", "0",
        "--max_steps", str(size.steps), "--per_device_generation_batch_size", str(size.rollouts),
        "--per_device_training_batch_size", "8", "--ppo_epochs", "1",
        "--actor_learning_rate", f"{s.lr:g}", "--critic_learning_rate", "5e-4",
        "--lr_scheduler_type", "constant", "--kl_ctl", "0.01", "--lam", f"{s.lam:g}",
        "--seed", str(seed), "--disable_progress_bar", "--output_dir", str(run),
        *arm_flags(arm, turns),
    ]  # fmt: skip
    if env_config:
        cmd += ["--env_config", env_config]
    return cmd


def held_out(run: Path, turns: int, games: int) -> dict:
    """The trained actor's figures on ``games`` held-out games, sampled (T = 1) and greedy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.pipeline.figures import trail_scores

    tok = AutoTokenizer.from_pretrained(run / "actor")
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(run / "actor", dtype=torch.float32).eval()
    return {
        "T1": trail_scores(model, tok, turns, games, 1.0),
        "greedy": trail_scores(model, tok, turns, games, 0.0),
    }


def run_and_eval(run: Path, cmd: list[str], evaluate, label: str) -> str:
    """One run: the stage command ``cmd`` (its output in ``run/stage.log``), then ``evaluate(run)``
    -> the held-out figures (``T1``/``gold`` among them), written with the wall time, the CPU
    seconds of the stage process and of the held-out figures, and the command to
    ``run/eval.json``; skipped when that file exists. Returns a progress line (``label``: the name
    of the T = 1 gold in it)."""
    if (run / "eval.json").exists():
        return f"{run}: done already"
    run.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(run / "stage.log", "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        # this child's own CPU: the process-wide children's times would also count the stages
        # that other workers' threads reap meanwhile
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        return f"{run}: FAILED (exit {proc.returncode}, see stage.log)"
    c0 = time.thread_time()  # the held-out figures run in this thread
    figures = evaluate(run)
    figures["cpu_s_held_out"] = round(time.thread_time() - c0, 1)
    figures["wall_s"] = round(time.time() - t0, 1)
    figures["cpu_s_stage"] = round(usage.ru_utime + usage.ru_stime, 1)
    figures["command"] = " ".join(cmd[1:])
    (run / "eval.json").write_text(json.dumps(figures, indent=1))
    return f"{run}: {figures['wall_s']:.0f} s, {label} {figures['T1']['gold']:.3f}"


def train_and_eval(job: tuple, turns: int, size: Size, env_config: str | None) -> str:
    """One run of ``job`` (out, arm, setting, seed): :func:`run_and_eval`."""
    out, arm, s, seed = job
    run = run_dir(out, turns, arm, s, seed)
    cmd = stage_command(run, turns, arm, s, seed, size, env_config)
    return run_and_eval(run, cmd, lambda r: held_out(r, turns, size.held_out), "held-out gold")


def read_run(run: Path) -> dict | None:
    """A finished run's training curves (:func:`benchmarks.analysis.last_rows`) and held-out
    figures, or None."""
    if not (run / "eval.json").exists():
        return None
    rows = last_rows(run / "metrics.jsonl")
    return {
        # the final reward alone (the gold); runs logged before the env reported it had no
        # per-turn reward, so their return is the gold
        "gold": [r.get("env/gold", r["env/return"]) for r in rows],
        "first_call": [r.get("env/first_call_key", float("nan")) for r in rows],
        "eval": json.loads((run / "eval.json").read_text()),
    }


def run_all(
    jobs: list[tuple],
    workers: int,
    turns: int,
    size: Size,
    env_config: str | None,
    work=None,
    tag: str = "turn_credit",
) -> None:
    """Every job, ``workers`` at a time, a line each as it ends: ``work(job, turns, size,
    env_config)`` (default :func:`train_and_eval`) returns the line; ``tag`` prefixes it."""
    work = work or train_and_eval
    # transformers' lazy imports are not thread-safe: resolved here, before the worker threads
    # import them (two threads importing at once failed with an ImportError)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import marlhf.pipeline.figures  # noqa: F401

    print(f"[{tag}] {len(jobs)} runs", flush=True)
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(work, j, turns, size, env_config) for j in jobs]
        for f in futures:
            print(f"[{tag}] {f.result()}", flush=True)


def tuning_table(
    out: Path, turns: int, arms, seeds, read=None, settings=None
) -> tuple[dict[str, Setting], list[str]]:
    """Each arm's chosen setting and the table of every setting's selection score. ``read(arm,
    setting, seed)`` gives a finished run as :func:`read_run` does (None: not finished; default:
    this script's runs under ``out``), ``settings(arm)`` an arm's grid (default
    :func:`settings_of`)."""
    read = read or (lambda arm, s, seed: read_run(run_dir(out, turns, arm, s, seed)))
    settings = settings or settings_of
    lines = [
        "| arm | setting | seeds | final training gold | held-out gold | score |",
        "|---|---|---|---|---|---|",
    ]
    chosen = {}
    for arm in arms:
        scores = {}
        for s in settings(arm):
            got = [read(arm, s, seed) for seed in seeds]
            got = [g for g in got if g]
            if len(got) < len(seeds):
                continue
            finals = [final_value(g["gold"], FINAL_WINDOW) for g in got]
            held = [g["eval"]["T1"]["gold"] for g in got]
            scores[s] = selection_score(finals, held)
            lines.append(
                f"| {arm} | {s.label} | {len(got)} | {statistics.fmean(finals):.3f} | "
                f"{statistics.fmean(held):.3f} | {scores[s]:.3f} |"
            )
        best = choose(scores, settings(arm))
        if best is not None:
            chosen[arm] = best
    return chosen, lines


FIRST_CALLS = ("right first calls (T=1)", "first_call_key")


def report(
    out: Path,
    turns: int,
    chosen: dict[str, Setting],
    seeds,
    read=None,
    extra=(FIRST_CALLS,),
    pairs=(),
) -> list[str]:
    """The reported table: every arm at its chosen setting on ``seeds``, then :func:`curve_table`
    and, with ``pairs``, :func:`pair_table`. ``read`` as in :func:`tuning_table`; ``extra``: (the
    header, the key in ``eval["T1"]``) of each further held-out column."""
    read = read or (lambda arm, s, seed: read_run(run_dir(out, turns, arm, s, seed)))
    runs = {}
    for arm, s in chosen.items():
        got = [read(arm, s, seed) for seed in seeds]
        runs[arm] = [g for g in got if g]
    if not runs.get("ppo"):
        return ["(no finished ppo runs on the report seeds)"]
    base_final = [final_value(g["gold"], FINAL_WINDOW) for g in runs["ppo"]]
    base_held = [g["eval"]["T1"]["gold"] for g in runs["ppo"]]
    target = statistics.fmean(base_final)
    base_steps = min(len(g["gold"]) for g in runs["ppo"])
    lines = [
        "| arm | setting | seeds | final training gold | − ppo | held-out gold (T=1) | − ppo | "
        f"held-out greedy | {' | '.join(h for h, _ in extra)} | reaches ppo's final at | "
        "speed-up [95 % seed bootstrap] |",
        "|---" * (10 + len(extra)) + "|",
    ]
    for arm, got in runs.items():
        if not got:
            continue
        finals = [final_value(g["gold"], FINAL_WINDOW) for g in got]
        held = [g["eval"]["T1"]["gold"] for g in got]
        greedy = [g["eval"]["greedy"]["gold"] for g in got]
        further = " | ".join(pm(mean_ci([g["eval"]["T1"][k] for g in got])) for _, k in extra)
        curve = smooth(mean_curve([g["gold"] for g in got]), SMOOTH_WINDOW)
        reach = first_reach(list(range(1, len(curve) + 1)), curve, target)
        if arm == "ppo":  # the baseline: its speed-up over itself says nothing
            speed = "— (the baseline)"
        else:
            sp = speedup_of(base_steps, reach)
            boot = bootstrap_speedup(
                [g["gold"] for g in runs["ppo"]], [g["gold"] for g in got],
                final_window=FINAL_WINDOW, smooth_window=SMOOTH_WINDOW,
            )  # fmt: skip
            speed = f"{'—' if sp is None else f'{sp:.2f}'} [{boot.low:.2f}, {boot.high:.2f}]"
        lines.append(
            f"| {arm} | {chosen[arm].label} | {len(got)} | {pm(mean_ci(finals))} | "
            f"{pm(welch_diff_ci(finals, base_final))} | {pm(mean_ci(held))} | "
            f"{pm(welch_diff_ci(held, base_held))} | {pm(mean_ci(greedy))} | {further} | "
            f"{reach if reach is not None else 'never'} | "
            f"{speed} |"
        )
    return [*lines, "", *curve_table(runs), *(["", *pair_table(runs, pairs)] if pairs else [])]


def pair_table(runs: dict[str, list[dict]], pairs) -> list[str]:
    """The differences between two arms other than ``ppo`` (``pairs``: (a, b) each, a − b) that a
    registered question asks about: final training gold, held-out gold at T = 1 and the mean
    training gold over the run, each with Welch's 95 % interval; a pair missing an arm's runs is
    left out."""
    lines = [
        "| a − b | final training gold | held-out gold (T=1) | mean over the run |",
        "|---|---|---|---|",
    ]
    for a, b in pairs:
        if not runs.get(a) or not runs.get(b):
            continue
        n = min(len(g["gold"]) for g in (*runs[a], *runs[b]))
        fa, fb = ([_pair_figures(g, n) for g in runs[arm]] for arm in (a, b))
        cells = [pm(welch_diff_ci([x[i] for x in fa], [x[i] for x in fb])) for i in range(3)]
        lines.append(f"| {a} − {b} | {' | '.join(cells)} |")
    return lines


def _pair_figures(run: dict, n: int) -> tuple[float, float, float]:
    """A run's final training gold, held-out gold (T = 1) and mean gold over its first ``n``
    steps."""
    gold = run["gold"]
    return final_value(gold, FINAL_WINDOW), run["eval"]["T1"]["gold"], statistics.fmean(gold[:n])


def curve_table(runs: dict[str, list[dict]], parts: int = 10) -> list[str]:
    """Exploratory, beside the registered table: each arm's training gold, the mean over seeds of
    ``parts`` equal blocks of steps, and its mean over every step (the area under the curve per
    step, the speed of learning over the whole run) with Welch's 95 % interval of the difference
    to ppo. ``runs``: arm -> its runs (each with a per-step ``gold``), ppo among them."""
    n = min(len(g["gold"]) for got in runs.values() for g in got)
    size = max(1, n // parts)
    base = [statistics.fmean(g["gold"][:n]) for g in runs["ppo"]]
    lines = [
        f"Training gold by blocks of {size} steps and its mean over the {n} steps "
        "(exploratory: not among the registered figures):",
        "",
        "| arm | seeds | blocks of steps | mean over the run | − ppo |",
        "|---|---|---|---|---|",
    ]
    for arm, got in runs.items():
        if not got:
            continue
        curve = mean_curve([g["gold"][:n] for g in got])
        blocks = [statistics.fmean(curve[i : i + size]) for i in range(0, size * (n // size), size)]
        means = [statistics.fmean(g["gold"][:n]) for g in got]
        lines.append(
            f"| {arm} | {len(got)} | {', '.join(f'{b:.2f}' for b in blocks)} | "
            f"{pm(mean_ci(means))} | {pm(welch_diff_ci(means, base))} |"
        )
    return lines


def add_study_args(p: argparse.ArgumentParser, output_dir: Path, arms, sizes) -> None:
    """The flags every credit comparison shares: output, arms (``arms``: the default of
    ``--arms``), seeds, phases, size, workers."""
    # absolute: the stages run in the repository root, wherever the script was started from
    p.add_argument("--output_dir", type=lambda v: Path(v).resolve(), default=output_dir)
    p.add_argument("--arms", default=",".join(arms))
    p.add_argument("--seeds", default=",".join(map(str, REPORT_SEEDS)))
    p.add_argument("--tune", action="store_true", help="tune every arm on the grid first")
    p.add_argument("--tune_seeds", default=",".join(map(str, TUNE_SEEDS)))
    p.add_argument("--tune_only", action="store_true")
    p.add_argument("--analyze_only", action="store_true")
    p.add_argument("--size", default="cpu", choices=tuple(sizes))
    p.add_argument("--workers", type=int, default=1)


def study_arms(p: argparse.ArgumentParser, args, arms) -> tuple[list[str], list[int], list[int]]:
    """``--arms`` (checked against ``arms``), ``--seeds`` and ``--tune_seeds`` as lists."""
    named = [a for a in args.arms.split(",") if a]
    unknown = [a for a in named if a not in arms]
    if unknown:
        p.error(f"--arms: unknown arm(s) {', '.join(unknown)}; the arms: {', '.join(arms)}")
    seeds = [int(x) for x in args.seeds.split(",") if x]
    return named, seeds, [int(x) for x in args.tune_seeds.split(",") if x]


def run_study(
    args, arms, seeds, tune_seeds, *, settings, run, tune, rep, summary: Path, tag: str, shown=None
) -> int:
    """The phases of a credit comparison: with ``--tune``, every arm's grid on the tuning seeds
    (``run(jobs)``, jobs ``(out, arm, setting, seed)``) and ``tune(arms, seeds)`` -> (chosen,
    table lines); then, unless ``--tune_only``, the chosen settings on ``seeds`` and ``rep(chosen,
    seeds)`` -> table lines (without ``--tune`` every arm runs its grid's first setting). ``shown``:
    the arms of the tables (default ``arms``); ``summary``: the file both tables go to."""
    out, t0 = args.output_dir, time.time()
    shown = shown or arms
    if args.tune and not args.analyze_only:
        run([(out, a, s, seed) for seed in tune_seeds for a in arms for s in settings(a)])
    chosen, tune_lines = (
        tune(shown, tune_seeds) if args.tune else ({a: settings(a)[0] for a in shown}, [])
    )
    if args.tune:
        print("\nTuning (seeds " + ",".join(map(str, tune_seeds)) + "):\n" + "\n".join(tune_lines))
        print("chosen: " + ", ".join(f"{a} {s.label}" for a, s in chosen.items()))
    lines = []
    if not args.tune_only:
        if not args.analyze_only:
            run([(out, a, chosen[a], seed) for seed in seeds for a in arms if a in chosen])
        lines = rep(chosen, seeds)
        print("\nReported (seeds " + ",".join(map(str, seeds)) + "):\n" + "\n".join(lines))
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text("\n".join(["## Tuning", *tune_lines, "", "## Reported", *lines, ""]))
    print(f"\n[{tag}] {time.time() - t0:.0f} s; tables in {summary}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_study_args(p, ROOT / "output" / "turn_credit", REGISTERED_ARMS, SIZES)
    p.add_argument("--turns", type=int, default=4, choices=(2, 4, 8))
    p.add_argument("--env_config", default=None, help="e.g. '{\"step_reward\": 0.1}'")
    args = p.parse_args(argv)
    arms, seeds, tune_seeds = study_arms(p, args, ARMS)
    size, out, turns = SIZES[args.size], args.output_dir, args.turns
    return run_study(
        args, arms, seeds, tune_seeds,
        settings=settings_of,
        run=lambda jobs: run_all(jobs, args.workers, turns, size, args.env_config),
        tune=lambda shown, ts: tuning_table(out, turns, shown, ts),
        rep=lambda chosen, rs: report(out, turns, chosen, rs),
        summary=out / f"summary_trail{turns}.md", tag="turn_credit",
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
