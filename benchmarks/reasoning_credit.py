"""Reasoning steps as macro actions on multi-step arithmetic (``synthetic-arith-{4,8,16}``): does a
step line as one macro action reach token-level PPO's final accuracy sooner, and end higher, when
each arm runs at its own best setting?

The task (``marlhf/data/reasoning_tasks.py``, docs/guide/stages.md): a start number and k
operations, solved one line per step (``B-4: 21-4 is 17.``) and ended by ``answer: N``; the reward
(``--reward_source gold``, ``reasoning_tasks.arith_gold``) is 1 for the right final answer and 0
otherwise, so one slip at any step costs the whole reward. The base ``tiny-base-arith`` writes the
format; its 4-step accuracy at T = 1 is 0.17, and 46 of its 47 wrong greedy 4-step answers have a
wrong first line (docs/research/tasks-and-models.md).

Pre-registered (docs/research/reasoning.md, written before any run of this script):

- Arms (one flag set each, :data:`ARMS`): ``ppo`` (token-level GAE, ``--ngram 1``), ``step``
  (MA-PPO with ``--termination_condition step``: a macro action ends at each newline, so a step
  line is one macro action and the answer line another), ``fixed10`` (``--ngram 10``),
  ``lowprob10`` (``--termination_condition lowprob --target_macro_len 10``), ``grpo`` and
  ``dr_grpo`` (whole responses compared in groups of 4), and ``macro_mc`` (VinePPO-like: the
  ``step`` rule's macro actions, K = 4 continuations from the current policy at each step start;
  ``--mc_boundary_selection spread`` with ``--mc_max_boundaries 2k`` chooses every interior
  boundary of a response of at most 2k + 1 lines, i.e. every step start, since the format has k + 1
  lines; the ``spaced`` selection places boundaries by token counts, which with lines of 13-15
  tokens would skip or merge step starts).
- Tuning (``--tune``): every arm on the same grid, GAE's λ ∈ {0.95, 1} (the critic arms; the
  critic-free ones have no λ) × actor learning rate ∈ {1e-4, 2e-4}, on tuning seeds 1-3; each arm
  keeps its best setting by :func:`benchmarks.tuning.choose` on the selection score of
  :mod:`benchmarks.tuning` (the mean over seeds of (final training accuracy + held-out accuracy) / 2).
- Report: the chosen settings on seeds 11-20 (:data:`REPORT_SEEDS`). Per arm: final training
  accuracy (the mean of the last 5 steps' ``objective/gold``), held-out accuracy on the 300
  held-out problems at T = 1 and greedy, the share of step lines right at T = 1; differences to
  ``ppo`` with Welch's 95 % interval over seeds; the speed-up (the first step at which an arm's
  smoothed mean curve reaches ``ppo``'s final training accuracy, ``ppo``'s steps over it) with a
  seed bootstrap.
- Settings: ``synthetic-arith-4`` (``--steps 8`` or ``16`` for the longer tasks), 16 responses a
  step (4 prompts × 4 for the group arms), critic lr 5e-4, ``--kl_ctl 0.01``, T = 1, one PPO epoch
  in minibatches of 8, constant learning rates, :data:`SIZES`' steps.

Each run is a ``python -m marlhf.stages.ppo`` process (its directory under ``--output_dir`` holds
``metrics.jsonl``, the actor, and ``eval.json`` with the held-out figures); a finished run (with its
``eval.json``) is skipped, so the same command resumes. ``--analyze_only`` prints the tables from what
is there.

    S=benchmarks/reasoning_credit.py; O="--output_dir output/reasoning_credit --workers 2"
    python $S --tune --tune_only --arms ppo,step $O                 # tuning, 24 runs, ~24 min
    python $S --tune --tune_only --arms fixed10,lowprob10 $O        # tuning, 24 runs, ~26 min
    python $S --tune --tune_only --arms grpo,dr_grpo,macro_mc $O    # tuning, 18 runs, ~30 min
    python $S --tune --arms ppo,step,fixed10,lowprob10 $O           # report, 40 runs, ~42 min
    python $S --tune --arms grpo,dr_grpo $O                         # report, 20 runs, ~18 min
    python $S --tune --arms macro_mc $O                             # report, 10 runs, ~32 min
    python $S --tune --analyze_only $O                              # the tables

(:data:`TUNE_GROUPS`, :data:`REPORT_GROUPS`; a report command reads the tuning of its arms and of
``ppo``, the baseline, from the same ``--output_dir``.)

Sizing, measured on the shared 2-core CPU (``nice -n 15``, ``OMP_NUM_THREADS=1``; CPU seconds, which
track an idle core's wall time): smoke runs of each arm on ``synthetic-arith-4`` at 16 responses a
step, 31 steps (11 for ``macro_mc``) less a 1-step run (its start-up, about 9 CPU s), give
:data:`CPU_S_PER_STEP`: 0.41-0.56 CPU s a step for the six arms without continuations, 1.82 for
``macro_mc``; the held-out answers (300 problems, T = 1 and greedy) take about 10 CPU s. A run of
the ``cpu`` size (200 steps) is then about 2.3 CPU min (``macro_mc`` 6.4); a command of N runs
with two workers takes about N × that / 2 wall minutes on 2 idle cores (:func:`plan_minutes`,
printed before each phase; the test checks every command above stays within 60). ``--steps 8``
and ``16`` cost :data:`LONGER` times more a step (longer answers; more step starts for
``macro_mc``) and must be split into smaller arm groups or fewer steps. ``--size gpu`` (200 steps
of 64 responses): the tiny model takes well under 1 GB a run, so any one GPU runs it; an H100
(80 GB) holds every run of a phase at once with ``--workers`` up to the CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.analysis import load_run  # noqa: E402
from benchmarks.ppo_vs_mappo import ALL_ARMS  # noqa: E402
from benchmarks.tuning import TUNE_LRS, TUNE_SEEDS, Setting  # noqa: E402
from benchmarks.turn_credit import REPORT_SEEDS, TUNE_LAMS, report, run_all, tuning_table  # noqa: E402

CRITIC_ARMS = ("ppo", "step", "fixed10", "lowprob10")
STEP_RULE = ["--termination_condition", "step"]
# Monte-Carlo values at every step start (--mc_max_boundaries 2 k on the k-step task, by arm_flags)
MC_FLAGS = [
    "--n_samples_per_prompt", "4", "--mc_rollouts", "4", "--mc_boundary_selection", "spread",
]  # fmt: skip
ARMS: dict[str, list[str]] = {
    "ppo": ALL_ARMS["ppo"],
    "step": STEP_RULE,
    "fixed10": ALL_ARMS["fixed10"],
    "lowprob10": ["--termination_condition", "lowprob", "--target_macro_len", "10"],
    "grpo": ALL_ARMS["grpo"],
    "dr_grpo": ALL_ARMS["dr_grpo"],
    "macro_mc": [*STEP_RULE, "--advantage_estimator", "macro_mc", *MC_FLAGS],
}
STEPS = (4, 8, 16)
# max prompt tokens, max answer tokens per task (prompts 38/54/86 tokens, solutions up to 68/128/248)
SEQ = {4: (48, 96), 8: (64, 160), 16: (96, 288)}
HELD_OUT = 300  # every held-out problem of a task (reasoning_tasks.N_VALID)
LINES = ("step lines right (T=1)", "line_accuracy")
# The smoke measurement (module docstring): CPU s a step of 16 responses on synthetic-arith-4, one
# thread, after start-up (runs of 31 steps, 11 for macro_mc, less a 1-step run's CPU)
CPU_S_PER_STEP = {
    "ppo": 0.47, "step": 0.54, "fixed10": 0.56, "lowprob10": 0.56,
    "grpo": 0.46, "dr_grpo": 0.41, "macro_mc": 1.82,
}  # fmt: skip
# a step's cost at 8 and 16 steps over its cost at 4 (measured on ppo, and on macro_mc for it)
LONGER = {4: (1.0, 1.0), 8: (2.0, 3.0), 16: (4.5, 9.0)}
# a run's start-up (stage start and first step, about 9 CPU s) and its held-out answers (300
# problems at T = 1 and greedy: 10 CPU s at 4 steps, longer answers at 8 and 16)
RUN_OVERHEAD_S = {4: 20.0, 8: 35.0, 16: 50.0}
# the documented commands' arm groups, each at most 60 min on 2 idle cores (tests check it)
TUNE_GROUPS = (("ppo", "step"), ("fixed10", "lowprob10"), ("grpo", "dr_grpo", "macro_mc"))
REPORT_GROUPS = (("ppo", "step", "fixed10", "lowprob10"), ("grpo", "dr_grpo"), ("macro_mc",))


@dataclass(frozen=True)
class Size:
    """How large a run is: steps, responses a step, held-out problems."""

    steps: int
    rollouts: int
    held_out: int


SIZES = {"cpu": Size(200, 16, HELD_OUT), "gpu": Size(200, 64, HELD_OUT), "smoke": Size(2, 8, 8)}


def settings_of(arm: str, lams=TUNE_LAMS, lrs=TUNE_LRS) -> list[Setting]:
    """The grid of ``arm`` in its order (λ, then learning rate); one λ for a critic-free arm.

    >>> [s.label for s in settings_of("dr_grpo", (0.95, 1.0), (1e-4,))]
    ['λ=1, lr=1e-04']
    """
    lam_grid = lams if arm in CRITIC_ARMS else (1.0,)
    return [Setting(lam, lr) for lam in lam_grid for lr in lrs]


def arm_flags(arm: str, steps: int) -> list[str]:
    """The flags of ``arm`` on the ``steps``-step task: ``macro_mc`` gets ``--mc_max_boundaries
    2 * steps`` (every step start of a response with up to 2 k + 1 lines).

    >>> arm_flags("macro_mc", 8)[-2:]
    ['--mc_max_boundaries', '16']
    """
    flags = list(ARMS[arm])
    return flags + ["--mc_max_boundaries", str(2 * steps)] if arm == "macro_mc" else flags


def run_dir(out: Path, steps: int, arm: str, s: Setting, seed: int) -> Path:
    """``out/arith4/step/lam0.95_lr1e-04/seed11``"""
    return out / f"arith{steps}" / arm / f"lam{s.lam:g}_lr{s.lr:.0e}" / f"seed{seed}"


def stage_command(run: Path, steps: int, arm: str, s: Setting, seed: int, size: Size) -> list[str]:
    """The stage-3 command of one run."""
    prompt_len, answer_len = SEQ[steps]
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo",
        "--actor_model_name_or_path", "tiny-base-arith",
        "--critic_model_name_or_path", "tiny-base-arith",
        "--data_path", f"synthetic-arith-{steps}", "--data_split", "0,0,1", "--data_seed", "1234",
        "--reward_source", "gold",
        "--max_prompt_seq_len", str(prompt_len), "--max_answer_seq_len", str(answer_len),
        "--temperature", "1.0", "--top_k", "0",
        "--max_steps", str(size.steps), "--num_train_epochs", "100",
        "--per_device_generation_batch_size", str(size.rollouts),
        "--per_device_training_batch_size", "8", "--ppo_epochs", "1",
        "--actor_learning_rate", f"{s.lr:g}", "--critic_learning_rate", "5e-4",
        "--lr_scheduler_type", "constant", "--kl_ctl", "0.01", "--lam", f"{s.lam:g}",
        "--seed", str(seed), "--disable_progress_bar", "--output_dir", str(run),
        *arm_flags(arm, steps),
    ]  # fmt: skip
    return cmd


def held_out(run: Path, steps: int, problems: int) -> dict:
    """The trained actor's figures on ``problems`` held-out problems, sampled (T = 1) and greedy
    (``marlhf.pipeline.figures.arith_figures``), with ``gold`` = the accuracy."""
    from marlhf.pipeline.figures import arith_figures

    task = f"synthetic-arith-{steps}"
    figures = arith_figures(run / "actor", problems, tasks=(task,))
    return {mode: {**figures[f"{task}/{mode}"], "gold": figures[f"{task}/{mode}"]["accuracy"]}
            for mode in ("T1", "greedy")}  # fmt: skip


def train_and_eval(job: tuple, steps: int, size: Size, _env_config=None) -> str:
    """One run (skipped when its ``eval.json`` exists); returns a progress line."""
    out, arm, s, seed = job
    run = run_dir(out, steps, arm, s, seed)
    if (run / "eval.json").exists():
        return f"{run}: done already"
    run.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.time(), os.times()
    cmd = stage_command(run, steps, arm, s, seed, size)
    with open(run / "stage.log", "a") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode != 0:
        return f"{run}: FAILED (exit {proc.returncode}, see stage.log)"
    c_stage = os.times()
    figures = held_out(run, steps, size.held_out)
    c1 = os.times()
    figures["wall_s"] = round(time.time() - t0, 1)
    figures["cpu_s_stage"] = round(
        c_stage.children_user + c_stage.children_system - c0.children_user - c0.children_system, 1
    )
    figures["cpu_s_held_out"] = round(c1.user + c1.system - c_stage.user - c_stage.system, 1)
    figures["command"] = " ".join(cmd[1:])
    (run / "eval.json").write_text(json.dumps(figures, indent=1))
    return f"{run}: {figures['wall_s']:.0f} s, held-out accuracy {figures['T1']['gold']:.3f}"


def read_run(run: Path) -> dict | None:
    """A finished run's training accuracy curve (``objective/gold`` a step) and held-out figures,
    or None."""
    if not (run / "eval.json").exists():
        return None
    return {
        "gold": load_run(run / "metrics.jsonl")["gold"],
        "eval": json.loads((run / "eval.json").read_text()),
    }


def reader(out: Path, steps: int):
    """``read(arm, setting, seed)`` of :func:`benchmarks.turn_credit.tuning_table` and ``report``."""
    return lambda arm, s, seed: read_run(run_dir(out, steps, arm, s, seed))


def plan_minutes(jobs: list[tuple], steps: int, size: Size) -> float:
    """CPU minutes of ``jobs`` ((out, arm, setting, seed) tuples) on the ``steps``-step task, by
    the smoke measurement (:data:`CPU_S_PER_STEP`, :data:`LONGER`, :data:`RUN_OVERHEAD_S`).

    >>> jobs = [(None, "ppo", None, 1), (None, "macro_mc", None, 1)]
    >>> round(plan_minutes(jobs, 4, Size(100, 16, 300)), 2)  # (47 + 20 + 182 + 20) / 60
    4.48
    """
    factor, mc_factor = LONGER[steps]
    total = 0.0
    for _, arm, _, _ in jobs:
        per_step = CPU_S_PER_STEP[arm] * (mc_factor if arm == "macro_mc" else factor)
        total += size.steps * per_step * size.rollouts / 16 + RUN_OVERHEAD_S[steps]
    return total / 60


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", type=Path, default=ROOT / "output" / "reasoning_credit")
    p.add_argument("--steps", type=int, default=4, choices=STEPS, help="the task's step count")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seeds", default=",".join(map(str, REPORT_SEEDS)))
    p.add_argument("--tune", action="store_true", help="tune every arm on the grid first")
    p.add_argument("--tune_seeds", default=",".join(map(str, TUNE_SEEDS)))
    p.add_argument("--tune_only", action="store_true")
    p.add_argument("--analyze_only", action="store_true")
    p.add_argument("--size", default="cpu", choices=tuple(SIZES))
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        p.error(f"--arms: unknown arm(s) {', '.join(unknown)}; the arms: {', '.join(ARMS)}")
    seeds = [int(x) for x in args.seeds.split(",") if x]
    tune_seeds = [int(x) for x in args.tune_seeds.split(",") if x]
    size, out, k = SIZES[args.size], args.output_dir, args.steps
    read = reader(out, k)
    t0 = time.time()

    def run_phase(jobs: list[tuple]) -> None:
        print(f"[reasoning_credit] about {plan_minutes(jobs, k, size):.0f} CPU min", flush=True)
        run_all(jobs, args.workers, k, size, None, work=train_and_eval, tag="reasoning_credit")

    if args.tune and not args.analyze_only:
        run_phase([(out, a, s, seed) for seed in tune_seeds for a in arms for s in settings_of(a)])
    # the tables hold ppo, the baseline, also when a command runs other arms
    shown = list(dict.fromkeys(["ppo", *arms]))
    chosen, tune_lines = (
        tuning_table(out, k, shown, tune_seeds, read=read, settings=settings_of)
        if args.tune
        else ({a: Setting(0.95 if a in CRITIC_ARMS else 1.0, TUNE_LRS[0]) for a in shown}, [])
    )
    if args.tune:
        print("\nTuning (seeds " + ",".join(map(str, tune_seeds)) + "):\n" + "\n".join(tune_lines))
        print("chosen: " + ", ".join(f"{a} {s.label}" for a, s in chosen.items()))
    lines = []
    if not args.tune_only:
        if not args.analyze_only:
            run_phase([(out, a, chosen[a], seed) for seed in seeds for a in arms if a in chosen])
        lines = report(out, k, chosen, seeds, read=read, extra=LINES)
        print("\nReported (seeds " + ",".join(map(str, seeds)) + "):\n" + "\n".join(lines))
    summary = out / f"summary_arith{k}.md"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text("\n".join(["## Tuning", *tune_lines, "", "## Reported", *lines, ""]))
    print(f"\n[reasoning_credit] {time.time() - t0:.0f} s; tables in {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
