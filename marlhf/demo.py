"""The embedded pipeline in one command: tiny model + bundled synthetic TL;DR data, on CPU.

    SFT → reward model → vanilla PPO (fixed n=1) and MA-PPO (fixed n=5) → inference with rewards for
    SFT, PPO and MA-PPO on held-out prompts → a comparison report (RM score, gold score, RM-judged win
    rate, macro-action statistics, training curves as PNG).

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Settings sized for 2 CPU cores and a few minutes in all; the real recipes are in training/*/run_gemma.sh.
SFT_FLAGS = [
    "--model_name_or_path",
    "tiny-base",
    "--data_path",
    "synthetic-tldr",
    "--max_seq_len",
    "192",
    "--per_device_train_batch_size",
    "16",
    "--per_device_eval_batch_size",
    "32",
    "--learning_rate",
    "5e-4",
    "--num_train_epochs",
    "2",
    "--warmup_ratio",
    "0.05",
    "--lr_scheduler_type",
    "cosine",
    "--zero_stage",
    "0",
    "--eval_iters",
    "4",
]
RM_FLAGS = [
    "--data_path",
    "synthetic-tldr",
    "--max_seq_len",
    "192",
    "--per_device_train_batch_size",
    "16",
    "--per_device_eval_batch_size",
    "32",
    "--learning_rate",
    "3e-4",
    "--num_train_epochs",
    "4",
    "--warmup_ratio",
    "0.05",
    "--zero_stage",
    "0",
    "--eval_iters",
    "8",
]
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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(title: str, args: list[str], done: Path, log_file: Path, fresh: bool) -> None:
    if done.exists() and not fresh:
        print(f"[demo] {title}: already done ({done}), skipped", flush=True)
        return
    print(f"[demo] {title} ...", flush=True)
    t0 = time.time()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as log:
        proc = subprocess.run(
            [sys.executable, *args], env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    if proc.returncode != 0:
        tail = "".join(open(log_file).readlines()[-30:])
        raise SystemExit(f"[demo] {title} failed (exit {proc.returncode}); log {log_file}:\n{tail}")
    print(f"[demo] {title}: done in {time.time() - t0:.0f}s", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--output_dir", default="output/demo")
    ap.add_argument("--fresh", action="store_true", help="redo every stage")
    ap.add_argument(
        "--ppo_steps", type=int, default=30, help="PPO steps for each of PPO and MA-PPO"
    )
    ap.add_argument(
        "--ngram", type=int, default=5, help="MA-PPO macro-action length (fixed n-gram)"
    )
    ap.add_argument(
        "--eval_prompts", type=int, default=128, help="held-out prompts for the comparison"
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--reward_source",
        choices=("rm", "gold"),
        default="rm",
        help="PPO's reward: the trained reward model (the pipeline, default) or the synthetic "
        "task's gold score (an oracle; shows what the RL stage does without the RM's errors)",
    )
    args = ap.parse_args(argv)

    out = Path(args.output_dir).resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = str(out / "data_cache")
    logs = out / "logs"
    common = ["--data_output_path", cache, "--seed", str(args.seed), "--disable_progress_bar"]
    t_start = time.time()

    # 1. supervised fine-tuning
    _run(
        "1/6 SFT",
        ["-m", "marlhf.stages.sft", *SFT_FLAGS, *common, "--output_dir", str(out / "sft")],
        out / "sft" / "model.safetensors",
        logs / "sft.log",
        args.fresh,
    )
    # 2. reward model (initialised from the SFT model)
    _run(
        "2/6 reward model",
        [
            "-m",
            "marlhf.stages.reward",
            *RM_FLAGS,
            *common,
            "--model_name_or_path",
            str(out / "sft"),
            "--output_dir",
            str(out / "rm"),
        ],
        out / "rm" / "reward_config.json",
        logs / "rm.log",
        args.fresh,
    )
    # 3. vanilla PPO (fixed n=1 is token-level PPO exactly) and MA-PPO (fixed n)
    runs = {"ppo": 1, "mappo": args.ngram}
    for i, (name, n) in enumerate(runs.items()):
        _run(
            f"{3 + i}/6 {'PPO (n=1)' if n == 1 else f'MA-PPO (n={n})'}",
            [
                "-m",
                "marlhf.stages.ppo",
                *PPO_FLAGS,
                *common,
                "--actor_model_name_or_path",
                str(out / "sft"),
                "--critic_model_name_or_path",
                str(out / "rm"),
                "--termination_condition",
                "fixed",
                "--ngram",
                str(n),
                "--reward_source",
                args.reward_source,
                "--max_steps",
                str(args.ppo_steps),
                "--output_dir",
                str(out / name),
            ],
            out / name / "actor" / "model.safetensors",
            logs / f"{name}.log",
            args.fresh,
        )
    # 5. inference with rewards on held-out prompts, for each policy
    models = {"sft": out / "sft", "ppo": out / "ppo" / "actor", "mappo": out / "mappo" / "actor"}
    results = {}
    for name, path in models.items():
        target = out / "results" / f"{name}.jsonl"
        results[name] = target
        _run(
            f"5/6 inference ({name})",
            [
                str(ROOT / "inference" / "inference_with_rewards.py"),
                "--proj-path",
                str(out),
                "--dataset",
                "synthetic",
                "--model",
                str(path),
                "--reward-model",
                str(out / "rm"),
                "--num-samples",
                str(args.eval_prompts),
                "--batch-size",
                "32",
                "--max-new-tokens",
                "40",
                "--max-prompt-len",
                "160",
                "--temperature",
                "0.8",
                "--seed",
                str(args.seed),
                "--output",
                str(target),
            ],
            target.with_suffix(".jsonl.summary.json"),
            logs / f"inference_{name}.log",
            args.fresh,
        )
    # 6. the comparison report
    from marlhf.report import write_report

    report = write_report(
        out, results, {k: out / k for k in runs}, ngram=args.ngram, reward_source=args.reward_source
    )
    print(f"[demo] 6/6 report: {report}  (total {time.time() - t_start:.0f}s)", flush=True)
    print(report.read_text())


if __name__ == "__main__":
    main()
