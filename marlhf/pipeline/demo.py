"""The embedded pipeline in one command: a tiny model and a bundled synthetic task, on CPU.

    SFT → two answers of the SFT model to train prompts, compared by the simulated labeller →
    reward model (the task's comparisons + those) → vanilla PPO (fixed n=1) and MA-PPO (fixed n) →
    inference with rewards for SFT, PPO and MA-PPO on held-out prompts → a comparison report (RM
    score, gold score, gold gains over SFT and of MA-PPO over PPO, win rates, right verdicts,
    macro-action statistics, training curves as PNG).

The task (``--task``, :mod:`marlhf.pipeline.demo_settings`) is ``synthetic-verdict-64`` by
default: 64-token answers whose first fact decides a verdict paid only at the end of the answer,
where credit assignment over the answer matters; ``synthetic-tldr`` runs the short TL;DR-like task.

Every stage runs as its own process with the command line a user would run
(``python -m marlhf.stages.*``), forked from a server process that has imported torch, transformers,
datasets and DeepSpeed once (:mod:`marlhf.pipeline.launch`), and is skipped when its output already
exists (the pipeline resumes); ``--fresh`` redoes everything.
Given 2 threads or more (``OMP_NUM_THREADS``, 2 when unset), stages that need nothing from each
other (the two labelling runs, PPO and MA-PPO, the inference runs) run two at a time with half
the threads each.

    python -m marlhf.demo --output_dir output/demo
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from marlhf.cli import Parser
from marlhf.data.policy_comparisons import SAMPLE_SEEDS, SAMPLE_TEMPERATURE
from marlhf.pipeline.demo_settings import DEFAULT_TASK, TASKS, DemoTask
from marlhf.pipeline.launch import Launcher, Started
from marlhf.pipeline.report import write_report
from marlhf.runtime.run_lock import LOCK_FILE, OutputDirInUse, acquire, unusable_problem

ROOT = Path(__file__).resolve().parents[2]


def policy_pairs_file(out: Path) -> Path:
    """The labelled comparisons of the SFT model's answers in the demo's output directory."""
    return out / "labels" / "sft_pairs.jsonl"


def rm_flags(task: DemoTask, pairs: Path | None = None) -> list[str]:
    """The reward-model stage's flags of ``task``, with the labelled pairs of the SFT model's
    answers next to the task's own comparisons. Two answers of the SFT model to each train prompt,
    sampled as PPO samples (temperature 1), are compared by the simulated labeller
    (marlhf.data.policy_comparisons), as real RLHF labels the policy's own answers: an RM that saw
    only the generated kinds of summary over-scored errors the policy makes (repeated facts, a
    stray first word), and PPO found them (docs/results.md)."""
    extra = [] if pairs is None else ["--data_path", task.name, str(pairs)]
    return [*task.rm, *extra]


def ppo_epochs(steps: int, prompts: int = 760, rollouts: int = 16) -> int:
    """Passes over the demo's PPO prompts that ``steps`` steps of ``rollouts`` need (at least 1).

    >>> ppo_epochs(30), ppo_epochs(47), ppo_epochs(48), ppo_epochs(200)
    (1, 1, 2, 5)
    """
    return max(1, -(-steps // (prompts // rollouts)))


def threads() -> int:
    """The demo's CPU threads: ``OMP_NUM_THREADS`` (2 when unset, the Makefile's)."""
    value = os.environ.get("OMP_NUM_THREADS", "2")
    if not value.strip().isdigit() or int(value) < 1:
        raise SystemExit(f"error: OMP_NUM_THREADS={value!r}: the demo needs a whole number >= 1")
    return int(value)


def _env(n_threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(n_threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@dataclass
class Stage:
    """One step of the pipeline: a ``python`` command, skipped when ``done`` exists."""

    title: str
    key: str  # short name for the timings and the log file
    args: list[str]
    done: Path


@dataclass
class Timing:
    """Wall seconds of each stage a step ran (None: skipped) and the CPU seconds of the step."""

    wall: dict[str, float | None]
    cpu: float


_launcher: Launcher | None = None


def start_stage(args: list[str], *, env: dict[str, str], log: Path, cwd: Path) -> Started:
    """Start the stage's ``python ARGS`` with ``env`` in ``cwd``, its output appended to ``log``:
    a process forked from the demo's server that has imported torch, transformers, datasets and
    DeepSpeed once (:mod:`marlhf.pipeline.launch`; about 5 s less start-up a stage)."""
    global _launcher
    if _launcher is None:
        _launcher = Launcher(_env(threads()))
    return _launcher.start(args, env, cwd, log)


def _titles(stages: list[tuple[Stage, int]]) -> str:
    return ", ".join(stage.title for stage, _ in stages) or "between stages"


def run_step(stages: list[Stage], logs: Path, fresh: bool, lanes: int = 1) -> Timing:
    """Run the stages of one pipeline step, which need nothing from each other: each as its own
    process (log in ``logs/<key>.log``), ``lanes`` at a time, each with ``threads() // lanes``
    threads while more than one runs (two stages share 2 cores instead of oversubscribing them).

    A stage whose output exists is skipped (unless ``fresh``). Ctrl-C reaches every stage too
    (the terminal signals the process group): the demo waits for them to save and stop. SIGTERM
    reaches the demo alone (a scheduler, ``kill``): it is passed on to every running stage, which
    saves and stops (marlhf.runtime.preemption), and the demo waits for them, so no stage is left
    training with its output directory locked; repeats are passed on as well. Either way the demo
    then exits with a line saying that the same command resumes it (status 143 after SIGTERM).
    A failed stage stops the others the same way before the demo exits with the tail of its log."""
    wall: dict[str, float | None] = {}
    todo = []
    for stage in stages:
        if stage.done.exists() and not fresh:
            print(f"[demo] {stage.title}: already done ({stage.done}), skipped", flush=True)
            wall[stage.key] = None
        else:
            todo.append(stage)
    lanes = max(1, min(lanes, len(todo)))
    n_threads = threads() if lanes == 1 else max(1, threads() // lanes)
    logs.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[Stage, Started, float]] = {}
    ended: list[tuple[Stage, int]] = []  # stages that ended after a stop was asked for
    terms: list[int] = []
    failed: list[tuple[Stage, int]] = []

    def pass_on(signum: int, frame) -> None:
        terms.append(signum)
        for _, proc, _ in running.values():
            proc.send_signal(signum)

    cpu = 0.0
    previous = signal.signal(signal.SIGTERM, pass_on)
    try:
        while todo or running:
            while todo and len(running) < lanes and not (terms or failed):
                stage = todo.pop(0)
                print(f"[demo] {stage.title} ...", flush=True)
                log = logs / f"{stage.key}.log"
                log.write_text("")
                proc = start_stage(stage.args, env=_env(n_threads), log=log, cwd=ROOT)
                running[stage.key] = (stage, proc, time.time())
                if terms:  # it came while the stage was starting
                    proc.send_signal(signal.SIGTERM)
            if (terms or failed) and not running:
                break
            done = [k for k, (_, proc, _) in running.items() if proc.poll() is not None]
            if not done:
                time.sleep(0.1)
            for key in done:
                stage, proc, t0 = running.pop(key)
                if terms or failed:
                    ended.append((stage, proc.returncode))
                elif proc.returncode != 0:
                    failed.append((stage, proc.returncode))
                    for _, other, _ in running.values():  # they save and stop
                        other.send_signal(signal.SIGTERM)
                else:
                    wall[key] = time.time() - t0
                    cpu += proc.cpu_s
                    print(f"[demo] {stage.title}: done in {wall[key]:.0f}s", flush=True)
    except KeyboardInterrupt:  # the stages got the Ctrl-C too: they save and stop
        codes = [(stage, proc.wait()) for stage, proc, _ in running.values()]
        raise SystemExit(
            f"[demo] {_titles(codes)}: interrupted (exit "
            f"{', '.join(str(c) for _, c in codes)}); the same command resumes the demo"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        stage, code = failed[0]
        log_file = logs / f"{stage.key}.log"
        tail = "".join(open(log_file).readlines()[-30:])
        raise SystemExit(f"[demo] {stage.title} failed (exit {code}); log {log_file}:\n{tail}")
    if terms:
        print(
            f"[demo] {_titles(ended)}: stopped by SIGTERM (stage exit "
            f"{', '.join(str(c) for _, c in ended)}); the same command resumes the demo",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + signal.SIGTERM)
    return Timing(wall, cpu)


def _run(stage: Stage, logs: Path, fresh: bool) -> float | None:
    """Run one stage alone (:func:`run_step`); its wall time, None if skipped."""
    return run_step([stage], logs, fresh).wall[stage.key]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = Parser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--output_dir", default="output/demo")
    ap.add_argument("--fresh", action="store_true", help="redo every stage")
    ap.add_argument(
        "--task",
        choices=tuple(TASKS),
        default=DEFAULT_TASK,
        help="the synthetic task (marlhf.pipeline.demo_settings): 64-token answers whose opening "
        "verdict is paid at their end (default), or 15-20-token TL;DR-like summaries",
    )
    ap.add_argument(
        "--ppo_steps",
        type=int,
        default=None,
        help="PPO steps for each of PPO and MA-PPO (default: the task's, 30 or 47)",
    )
    ap.add_argument(
        "--ngram",
        type=int,
        default=None,
        help="MA-PPO macro-action length (fixed n-gram; default: the task's, 10 or 5)",
    )
    ap.add_argument(
        "--eval_prompts",
        type=int,
        default=None,
        help="held-out prompts for the comparison (default: the task's, 200 or 300)",
    )
    ap.add_argument("--seed", type=int, default=1234, help="seed of every stage (and the data)")
    ap.add_argument(
        "--ppo_seed",
        type=int,
        default=None,
        help="seed of the two PPO runs only (default --seed); the data split stays --seed's",
    )
    ap.add_argument(
        "--reward_source",
        choices=("rm", "gold"),
        default="rm",
        help="PPO's reward: the trained reward model (the pipeline, default) or the synthetic "
        "task's gold score (an oracle; shows what the RL stage does without the RM's errors)",
    )
    ap.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default=None,
        help="precision of every training stage and of inference (default: each program's own)",
    )
    args = ap.parse_args(argv)
    task = TASKS[args.task]
    for name in ("ppo_steps", "ngram", "eval_prompts"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(task, name))
        elif getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def with_dtype(stages: list[Stage], dtype: str | None) -> list[Stage]:
    """``stages`` with ``--dtype`` added to the training stages and inference (not the labeller)."""
    if dtype is None:
        return stages
    for s in stages:
        if s.args[0] != "-m" or s.args[1].startswith("marlhf.stages."):
            s.args = [*s.args, "--dtype", dtype]
    return stages


def _inference_args(task: DemoTask, out: Path, model: Path, seed: int) -> list[str]:
    return [
        str(ROOT / "inference" / "inference_with_rewards.py"),
        "--proj-path", str(out),
        "--dataset", task.inference_dataset,
        "--model", str(model),
        "--max-new-tokens", str(task.answer_len),
        "--max-prompt-len", str(task.prompt_len),
        "--seed", str(seed),
    ]  # fmt: skip


def labelling_stages(task: DemoTask, out: Path) -> list[Stage]:
    """The SFT model's answers to the train prompts (all, or ``task.label_prompts`` of them), twice,
    and the labeller's comparisons of them."""
    pairs = policy_pairs_file(out)
    samples = [pairs.with_name(f"sft_seed{s}.jsonl") for s in SAMPLE_SEEDS]
    # the same prompts in both runs (by default the sampling seed also draws them)
    which = ["--num-samples", str(task.label_prompts)]
    if task.label_prompts:
        which += ["--prompt-seed", "0"]
    stages = [
        Stage(
            f"2/6 SFT answers to the train prompts for labelling (seed {s})",
            f"label_samples{s}",
            [*_inference_args(task, out, out / "sft", s), "--split", "train", *which]
            + ["--batch-size", "64", "--temperature", str(SAMPLE_TEMPERATURE)]
            + ["--disable_progress_bar", "--output", str(path)],
            path.with_suffix(".jsonl.summary.json"),
        )
        for s, path in zip(SAMPLE_SEEDS, samples, strict=True)
    ]
    stages.append(
        Stage(
            "2/6 labelled comparisons of the SFT answers",
            "label_pairs",
            ["-m", "marlhf.data.policy_comparisons", "--task", task.name, "--samples"]
            + [*map(str, samples), "--output", str(pairs)],
            pairs,
        )
    )
    return stages


def _scored_args(task: DemoTask, out: Path, model: Path, seed: int) -> list[str]:
    """Held-out answers (or comparisons) scored by the demo's reward model (and gold)."""
    return [*_inference_args(task, out, model, seed), "--reward-model", str(out / "rm")] + [
        "--batch-size", "32", "--temperature", str(task.eval_temperature),
    ]  # fmt: skip


def sft_stage(task: DemoTask, args: argparse.Namespace, out: Path) -> Stage:
    common = ["--data_output_path", str(out / "data_cache"), "--disable_progress_bar"]
    return Stage(
        "1/6 SFT",
        "sft",
        ["-m", "marlhf.stages.sft", *task.sft, *common, "--seed", str(args.seed)]
        + ["--output_dir", str(out / "sft")],
        out / "sft" / "model.safetensors",
    )


def rm_stage(task: DemoTask, args: argparse.Namespace, out: Path) -> Stage:
    common = ["--data_output_path", str(out / "data_cache"), "--disable_progress_bar"]
    return Stage(
        "2/6 reward model",
        "rm",
        ["-m", "marlhf.stages.reward", *rm_flags(task, policy_pairs_file(out))]
        + [*common, "--seed", str(args.seed), "--output_dir", str(out / "rm")],
        out / "rm" / "reward_config.json",
    )


def ppo_stages(task: DemoTask, args: argparse.Namespace, out: Path) -> list[Stage]:
    """PPO (fixed n=1) and MA-PPO (fixed n = ``--ngram``) from the SFT model, critic from the RM."""
    common = ["--data_output_path", str(out / "data_cache"), "--disable_progress_bar"]
    seed = ["--seed", str(args.seed if args.ppo_seed is None else args.ppo_seed)]
    seed += ["--data_seed", str(args.seed)]
    stages = []
    for i, (name, n) in enumerate({"ppo": 1, "mappo": args.ngram}.items()):
        stages.append(
            Stage(
                f"{3 + i}/6 {'PPO (n=1)' if n == 1 else f'MA-PPO (n={n})'}",
                name,
                ["-m", "marlhf.stages.ppo", *task.ppo, *common, *seed]
                + ["--actor_model_name_or_path", str(out / "sft")]
                + ["--critic_model_name_or_path", str(out / "rm")]
                + ["--termination_condition", "fixed", "--ngram", str(n)]
                + ["--reward_source", args.reward_source, "--max_steps", str(args.ppo_steps)]
                # enough passes over the 760 prompts for any --ppo_steps (one pass is 47 steps of
                # 16; the constant learning rate makes the first 47 steps the same either way)
                + ["--num_train_epochs", str(ppo_epochs(args.ppo_steps))]
                + (task.learned_rm_ppo if args.reward_source == "rm" else [])
                + ["--output_dir", str(out / name)],
                out / name / "actor" / "model.safetensors",
            )
        )
    return stages


def inference_stages(
    task: DemoTask, args: argparse.Namespace, out: Path
) -> tuple[list[Stage], dict[str, Path]]:
    """The RM on all held-out comparisons, and the answers of SFT, PPO and MA-PPO to the held-out
    prompts, scored by the RM and gold."""
    stages = [
        Stage(
            "2/6 reward model on all held-out comparisons",
            "rm_heldout",
            [*_scored_args(task, out, out / "sft", args.seed), "--ref-scores"]
            + ["--num-samples", "0", "--output", str(out / "results" / "rm_heldout.jsonl")],
            out / "results" / "rm_heldout.jsonl.summary.json",
        )
    ]
    models = {"sft": out / "sft", "ppo": out / "ppo" / "actor", "mappo": out / "mappo" / "actor"}
    results = {}
    for name, path in models.items():
        target = out / "results" / f"{name}.jsonl"
        results[name] = target
        stages.append(
            Stage(
                f"5/6 inference ({name})",
                f"inference_{name}",
                [*_scored_args(task, out, path, args.seed)]
                + ["--num-samples", str(args.eval_prompts), "--output", str(target)],
                target.with_suffix(".jsonl.summary.json"),
            )
        )
    return stages, results


def pipeline(task: DemoTask, args: argparse.Namespace, out: Path) -> list[list[Stage]]:
    """The demo's steps in order; the stages of a step need nothing from each other."""
    labels = labelling_stages(task, out)
    return [
        [sft_stage(task, args, out)],
        labels[:-1],
        labels[-1:],
        [rm_stage(task, args, out)],
        ppo_stages(task, args, out),
        inference_stages(task, args, out)[0],
    ]


def lock_and_clear(out: Path, fresh: bool) -> None:
    """Take the demo's lock on ``out`` (one demo per directory: two would write the same label
    files and stage directories; :mod:`marlhf.runtime.run_lock`), then with ``fresh`` empty it
    (but the lock). A directory in use, or one that cannot be written (a file, read-only), stops
    the demo with one line naming it (exit status 2)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        acquire(out, uuid.uuid4().hex)
    except (OutputDirInUse, OSError) as e:
        problem = str(e) if isinstance(e, OutputDirInUse) else unusable_problem(out, e)
        print(f"error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if fresh:
        for p in out.iterdir():
            if p.name == LOCK_FILE:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    task = TASKS[args.task]
    out = Path(args.output_dir).resolve()
    # two stages at a time where they are independent, given 2 threads or more (half each)
    lanes = 2 if threads() >= 2 else 1
    lock_and_clear(out, args.fresh)
    t_start = time.time()
    timings: dict[str, float | None] = {}
    cpu = 0.0
    for step in pipeline(task, args, out):
        timing = run_step(with_dtype(step, args.dtype), out / "logs", args.fresh, lanes)
        timings.update(timing.wall)
        cpu += timing.cpu
    results = inference_stages(task, args, out)[1]
    report = write_report(
        out,
        results,
        {k: out / k for k in ("ppo", "mappo")},
        ngram=args.ngram,
        task=task.name,
        reward_source=args.reward_source,
        ref_scores=out / "results" / "rm_heldout.jsonl",
        policy_pairs=policy_pairs_file(out),
        timings=timings,
        cpu_s=cpu,
        threads=threads(),
    )
    print(f"[demo] 6/6 report: {report}  (total {time.time() - t_start:.0f}s)", flush=True)
    print(report.read_text())


if __name__ == "__main__":
    main()
