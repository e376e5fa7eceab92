"""The embedded pipeline in one command: tiny model + bundled synthetic TL;DR data, on CPU.

    SFT → two answers of the SFT model to every train prompt, compared by the simulated labeller →
    reward model (bundled comparisons + those) → vanilla PPO (fixed n=1) and MA-PPO (fixed n=5) →
    inference with rewards for SFT, PPO and MA-PPO on held-out prompts → a comparison report (RM
    score, gold score, RM-judged win rate, macro-action statistics, training curves as PNG).

Every stage runs as its own process, exactly as a user would run it (``python -m marlhf.stages.*``), and
is skipped when its output already exists (the pipeline resumes); ``--fresh`` redoes everything.

    python -m marlhf.demo --output_dir output/demo
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from marlhf.cli import Parser
from marlhf.data.policy_comparisons import SAMPLE_SEEDS, SAMPLE_TEMPERATURE
from marlhf.pipeline.report import write_report
from marlhf.runtime.run_lock import LOCK_FILE, OutputDirInUse, acquire, unusable_problem

ROOT = Path(__file__).resolve().parents[2]

# Settings sized for 2 CPU cores and a few minutes in all; the real recipes are in training/*/run_gemma.sh.
# The supervised stages' data, batch sizes and schedule shape, the same for SFT and the reward model:
_SUPERVISED_FLAGS = [
    "--data_path", "synthetic-tldr",
    "--max_seq_len", "192",
    "--per_device_train_batch_size", "16",
    "--per_device_eval_batch_size", "32",
    "--warmup_ratio", "0.05",
    "--zero_stage", "0",
]  # fmt: skip
SFT_FLAGS = [
    "--model_name_or_path", "tiny-base",
    *_SUPERVISED_FLAGS,
    "--learning_rate", "5e-4",
    "--num_train_epochs", "2",
    "--lr_scheduler_type", "cosine",
    "--eval_iters", "4",
]  # fmt: skip
RM_FLAGS = [
    *_SUPERVISED_FLAGS,
    "--learning_rate", "3e-4",
    "--num_train_epochs", "4",
    "--eval_iters", "8",
]  # fmt: skip
# One pass over the 760 PPO prompts in rollouts of 16 (30 steps were too few for a gain above
# seed noise; docs/research/reward-model.md, "A reward model that learns").
PPO_STEPS = 47


# The demo's reward model starts from tiny-rm-base (larger than the policy and preference-pretrained
# on generated comparisons, see marlhf.tiny) with its value head, and trains gently on the bundled
# comparisons plus comparisons of the SFT model's own answers (later flags win over RM_FLAGS).
RM_BASE_FLAGS = ["--model_name_or_path", "tiny-rm-base", "--init_value_head"]
RM_BASE_FLAGS += ["--learning_rate", "1e-4", "--num_train_epochs", "2"]
# Two answers of the SFT model to each train prompt, sampled as PPO samples (temperature 1), are
# compared by the simulated labeller (marlhf.data.policy_comparisons), as real RLHF labels the
# policy's own answers: an RM that saw only the generated kinds of summary over-scored errors the
# policy makes (repeated facts, a stray first word), and PPO found them (docs/results.md).


def policy_pairs_file(out: Path) -> Path:
    """The labelled comparisons of the SFT model's answers in the demo's output directory."""
    return out / "labels" / "sft_pairs.jsonl"


def rm_flags(pairs: Path | None = None) -> list[str]:
    """The reward-model stage's flags: ``RM_FLAGS`` then ``RM_BASE_FLAGS`` (and the labelled pairs
    of the SFT model's answers next to the bundled data)."""
    extra = [] if pairs is None else ["--data_path", "synthetic-tldr", str(pairs)]
    return [*RM_FLAGS, *RM_BASE_FLAGS, *extra]


PPO_FLAGS = [
    "--data_path",
    "synthetic-tldr",
    "--max_prompt_seq_len",
    "160",
    "--max_answer_seq_len",
    "40",
    "--per_device_generation_batch_size",
    "16",
    "--per_device_training_batch_size",
    "8",
    "--actor_learning_rate",
    "2e-4",
    "--critic_learning_rate",
    "5e-4",
    "--kl_ctl",
    "0.05",
    "--temperature",
    "1.0",
    "--top_k",
    "0",
    "--ppo_epochs",
    "1",
    "--lr_scheduler_type",
    "constant",
    "--value_function",
    "equal",
]
# With the learned RM (the default): tiny-rm-base's scores spread over several units, so PPO
# standardises them with the RM's saved eval mean/std before its ±2.5 clip, scores a response cut
# at the length limit 1 lower (an RM trained on finished summaries misjudges cut ones) and keeps
# closer to the SFT model (KL coefficient 0.2: at 0.05 both arms drifted to openers the RM
# over-scores; docs/research/reward-model.md, "A reward model that learns").
LEARNED_RM_PPO_FLAGS = ["--normalize_reward", "--no_eos_penalty", "-1", "--kl_ctl", "0.2"]


def ppo_epochs(steps: int, prompts: int = 760, rollouts: int = 16) -> int:
    """Passes over the demo's PPO prompts that ``steps`` steps of ``rollouts`` need (at least 1).

    >>> ppo_epochs(30), ppo_epochs(47), ppo_epochs(48), ppo_epochs(200)
    (1, 1, 2, 5)
    """
    return max(1, -(-steps // (prompts // rollouts)))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
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


def _run(stage: Stage, logs: Path, fresh: bool) -> float | None:
    """Run one stage as its own process (log in ``logs/<key>.log``); its wall time, None if skipped."""
    if stage.done.exists() and not fresh:
        print(f"[demo] {stage.title}: already done ({stage.done}), skipped", flush=True)
        return None
    print(f"[demo] {stage.title} ...", flush=True)
    t0 = time.time()
    log_file = logs / f"{stage.key}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, *stage.args],
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            proc.wait()
        except KeyboardInterrupt:  # the stage got the Ctrl-C too: it saves a checkpoint, stops
            proc.wait()
            raise SystemExit(
                f"[demo] {stage.title}: interrupted (exit {proc.returncode}); the same command "
                "resumes the demo"
            ) from None
    if proc.returncode != 0:
        tail = "".join(open(log_file).readlines()[-30:])
        raise SystemExit(
            f"[demo] {stage.title} failed (exit {proc.returncode}); log {log_file}:\n{tail}"
        )
    seconds = time.time() - t0
    print(f"[demo] {stage.title}: done in {seconds:.0f}s", flush=True)
    return seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = Parser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--output_dir", default="output/demo")
    ap.add_argument("--fresh", action="store_true", help="redo every stage")
    ap.add_argument(
        "--ppo_steps", type=int, default=PPO_STEPS, help="PPO steps for each of PPO and MA-PPO"
    )
    ap.add_argument(
        "--ngram", type=int, default=5, help="MA-PPO macro-action length (fixed n-gram)"
    )
    ap.add_argument(
        "--eval_prompts",
        type=int,
        default=300,
        help="held-out prompts for the comparison (all 300 of the bundled task by default)",
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
    return ap.parse_args(argv)


def with_dtype(stages: list[Stage], dtype: str | None) -> list[Stage]:
    """``stages`` with ``--dtype`` added to the training stages and inference (not the labeller)."""
    if dtype is None:
        return stages
    for s in stages:
        if s.args[0] != "-m" or s.args[1].startswith("marlhf.stages."):
            s.args = [*s.args, "--dtype", dtype]
    return stages


def labelling_stages(out: Path) -> list[Stage]:
    """The SFT model's answers to every train prompt, twice, and the labeller's comparisons of them."""
    pairs = policy_pairs_file(out)
    samples = [pairs.with_name(f"sft_seed{s}.jsonl") for s in SAMPLE_SEEDS]
    stages = [
        Stage(
            f"2/6 SFT answers to the train prompts for labelling (seed {s})",
            f"label_samples{s}",
            [str(ROOT / "inference" / "inference_with_rewards.py"), "--proj-path", str(out)]
            + ["--dataset", "synthetic", "--model", str(out / "sft"), "--split", "train"]
            + ["--num-samples", "0", "--batch-size", "64", "--max-new-tokens", "40"]
            + ["--max-prompt-len", "160", "--temperature", str(SAMPLE_TEMPERATURE)]
            + ["--seed", str(s), "--disable_progress_bar", "--output", str(path)],
            path.with_suffix(".jsonl.summary.json"),
        )
        for s, path in zip(SAMPLE_SEEDS, samples, strict=True)
    ]
    stages.append(
        Stage(
            "2/6 labelled comparisons of the SFT answers",
            "label_pairs",
            ["-m", "marlhf.data.policy_comparisons", "--task", "synthetic-tldr", "--samples"]
            + [*map(str, samples), "--output", str(pairs)],
            pairs,
        )
    )
    return stages


def training_stages(args: argparse.Namespace, out: Path) -> list[Stage]:
    """SFT, the reward model (and its held-out check), PPO (n=1) and MA-PPO (fixed n)."""
    common = ["--data_output_path", str(out / "data_cache"), "--disable_progress_bar"]
    seed = ["--seed", str(args.seed)]
    ppo_seed = ["--seed", str(args.seed if args.ppo_seed is None else args.ppo_seed)]
    ppo_seed += ["--data_seed", str(args.seed)]
    stages = [
        Stage(
            "1/6 SFT",
            "sft",
            [
                "-m",
                "marlhf.stages.sft",
                *SFT_FLAGS,
                *common,
                *seed,
                "--output_dir",
                str(out / "sft"),
            ],
            out / "sft" / "model.safetensors",
        ),
        *labelling_stages(out),
        Stage(
            "2/6 reward model",
            "rm",
            ["-m", "marlhf.stages.reward", *rm_flags(policy_pairs_file(out))]
            + [*common, *seed, "--output_dir", str(out / "rm")],
            out / "rm" / "reward_config.json",
        ),
        Stage(
            "2/6 reward model on all held-out comparisons",
            "rm_heldout",
            [*_inference_args(out, out / "sft", args.seed), "--ref-scores", "--num-samples", "0"]
            + ["--output", str(out / "results" / "rm_heldout.jsonl")],
            out / "results" / "rm_heldout.jsonl.summary.json",
        ),
    ]
    for i, (name, n) in enumerate({"ppo": 1, "mappo": args.ngram}.items()):
        stages.append(
            Stage(
                f"{3 + i}/6 {'PPO (n=1)' if n == 1 else f'MA-PPO (n={n})'}",
                name,
                ["-m", "marlhf.stages.ppo", *PPO_FLAGS, *common, *ppo_seed]
                + ["--actor_model_name_or_path", str(out / "sft")]
                + ["--critic_model_name_or_path", str(out / "rm")]
                + ["--termination_condition", "fixed", "--ngram", str(n)]
                + ["--reward_source", args.reward_source, "--max_steps", str(args.ppo_steps)]
                # enough passes over the 760 prompts for any --ppo_steps (one pass is 47 steps of
                # 16; the constant learning rate makes the first 47 steps the same either way)
                + ["--num_train_epochs", str(ppo_epochs(args.ppo_steps))]
                + (LEARNED_RM_PPO_FLAGS if args.reward_source == "rm" else [])
                + ["--output_dir", str(out / name)],
                out / name / "actor" / "model.safetensors",
            )
        )
    return stages


def _inference_args(out: Path, model: Path, seed: int) -> list[str]:
    return [
        str(ROOT / "inference" / "inference_with_rewards.py"),
        "--proj-path", str(out),
        "--dataset", "synthetic",
        "--model", str(model),
        "--reward-model", str(out / "rm"),
        "--batch-size", "32",
        "--max-new-tokens", "40",
        "--max-prompt-len", "160",
        "--temperature", "0.8",
        "--seed", str(seed),
    ]  # fmt: skip


def inference_stages(args: argparse.Namespace, out: Path) -> tuple[list[Stage], dict[str, Path]]:
    """Answers of SFT, PPO and MA-PPO to the held-out prompts, scored by the RM and gold."""
    models = {"sft": out / "sft", "ppo": out / "ppo" / "actor", "mappo": out / "mappo" / "actor"}
    stages, results = [], {}
    for name, path in models.items():
        target = out / "results" / f"{name}.jsonl"
        results[name] = target
        stages.append(
            Stage(
                f"5/6 inference ({name})",
                f"inference_{name}",
                [*_inference_args(out, path, args.seed), "--num-samples", str(args.eval_prompts)]
                + ["--output", str(target)],
                target.with_suffix(".jsonl.summary.json"),
            )
        )
    return stages, results


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
    out = Path(args.output_dir).resolve()
    lock_and_clear(out, args.fresh)
    t_start = time.time()
    infer, results = inference_stages(args, out)
    timings = {
        s.key: _run(s, out / "logs", args.fresh)
        for s in with_dtype([*training_stages(args, out), *infer], args.dtype)
    }

    report = write_report(
        out,
        results,
        {k: out / k for k in ("ppo", "mappo")},
        ngram=args.ngram,
        reward_source=args.reward_source,
        ref_scores=out / "results" / "rm_heldout.jsonl",
        policy_pairs=policy_pairs_file(out),
        timings=timings,
    )
    print(f"[demo] 6/6 report: {report}  (total {time.time() - t_start:.0f}s)", flush=True)
    print(report.read_text())


if __name__ == "__main__":
    main()
