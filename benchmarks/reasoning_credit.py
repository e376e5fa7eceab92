"""Reasoning steps as macro actions on multi-step arithmetic (``synthetic-arith-{4,8,16}``): does a
step line as one macro action reach token-level PPO's final accuracy sooner, and end higher, when
each arm runs at its own best setting?

The task (``marlhf/data/reasoning_tasks.py``, docs/guide/stages.md): a start number and k
operations, solved one line per step (``B-4: 21-4 is 17.``) and ended by ``answer: N``; the reward
(``--reward_source gold``, ``reasoning_tasks.arith_gold``) is 1 for the right final answer and 0
otherwise, so one slip at any step costs the whole reward. The base ``tiny-base-arith`` writes the
format and reads the problem; at T = 1 it writes the first step's operation right about half the
time (its corpus applies the other one to half the first lines) and slips on later lines at times:
4-step accuracy 0.30 at T = 1 (docs/research/tasks-and-models.md). The first line's sign is the
early decision the final answer pays for, about 65 tokens later.

Pre-registered (docs/research/reasoning.md, written before any tuning or reported run of this
script; its predictions written again for the remade base after a pilot on seed 0):

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
  held-out problems at T = 1 and greedy, the shares of step lines right and of first lines with step
  A's operation at T = 1; differences to
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
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.analysis import load_run  # noqa: E402
from benchmarks.ppo_vs_mappo import ALL_ARMS  # noqa: E402
from benchmarks.tuning import TUNE_LRS, Setting, arm_grid  # noqa: E402
from benchmarks.turn_credit import (  # noqa: E402
    TUNE_LAMS,
    add_study_args,
    report,
    run_all,
    run_and_eval,
    run_study,
    study_arms,
    tuning_table,
)

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
FIRST_OPERATION = ("first operation right (T=1)", "first_operation")  # the early decision
# The smoke measurement (module docstring): CPU s a step of 16 responses on synthetic-arith-4, one
# thread, after start-up (runs of 31 steps, 11 for macro_mc, less a 1-step run's CPU)
CPU_S_PER_STEP = {
    "ppo": 0.47, "step": 0.54, "fixed10": 0.56, "lowprob10": 0.56,
    "grpo": 0.46, "dr_grpo": 0.41, "macro_mc": 1.82,
}  # fmt: skip
# a step's cost at 8 and 16 steps over its cost at 4, measured on ppo (11 steps; 1.2 and 2.1 CPU s)
# and on macro_mc for it (4 and 3 steps; 4.8 and 19.2 CPU s: more step starts, longer continuations)
LONGER = {4: (1.0, 1.0), 8: (2.6, 2.6), 16: (4.5, 10.6)}
# a run's start-up (stage start and first step, about 9 CPU s) and its held-out answers (300
# problems at T = 1 and greedy: 10, 25 and 39 CPU s at 4, 8 and 16 steps)
RUN_OVERHEAD_S = {4: 20.0, 8: 35.0, 16: 50.0}
# the arms that questions 2 and 3 compare with each other (not only with ppo): the report's pair table
PAIRS = (("step", "fixed10"), ("step", "lowprob10"), ("fixed10", "lowprob10"), ("grpo", "dr_grpo"))

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
    return arm_grid(ARMS[arm], lams, lrs)


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
    """One run of ``job`` (out, arm, setting, seed): :func:`benchmarks.turn_credit.run_and_eval`."""
    out, arm, s, seed = job
    run = run_dir(out, steps, arm, s, seed)
    cmd = stage_command(run, steps, arm, s, seed, size)
    return run_and_eval(run, cmd, lambda r: held_out(r, steps, size.held_out), "held-out accuracy")


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
    add_study_args(p, ROOT / "output" / "reasoning_credit", ARMS, SIZES)
    p.add_argument("--steps", type=int, default=4, choices=STEPS, help="the task's step count")
    args = p.parse_args(argv)
    arms, seeds, tune_seeds = study_arms(p, args, ARMS)
    size, out, k = SIZES[args.size], args.output_dir, args.steps
    read = reader(out, k)

    def run(jobs: list[tuple]) -> None:
        print(f"[reasoning_credit] about {plan_minutes(jobs, k, size):.0f} CPU min", flush=True)
        run_all(jobs, args.workers, k, size, None, work=train_and_eval, tag="reasoning_credit")

    return run_study(
        args, arms, seeds, tune_seeds,
        settings=settings_of, run=run,
        tune=lambda shown, ts: tuning_table(out, k, shown, ts, read=read, settings=settings_of),
        rep=lambda chosen, rs: report(
            out, k, chosen, rs, read=read, extra=(LINES, FIRST_OPERATION), pairs=PAIRS
        ),
        summary=out / f"summary_arith{k}.md", tag="reasoning_credit",
        # the tables hold ppo, the baseline, also when a command runs other arms
        shown=list(dict.fromkeys(["ppo", *arms])),
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
