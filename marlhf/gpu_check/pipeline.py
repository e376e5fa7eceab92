"""The pipeline part of the acceptance run: every stage in bf16 on one model, each a process of its
own (as a user runs it) under :mod:`marlhf.gpu_check.runner`, which records its peak memory.

SFT (ZeRO-2) → reward model from the SFT checkpoint (ZeRO-2) → PPO n=1 (ZeRO-2) → MA-PPO n=5
(ZeRO-3, actor and critic) → GRPO (LoRA actor, G = 4) → macro_mc → inference with rewards on the PPO
actor. Each later run loads an earlier one's checkpoint (the SFT model, the reward model, the PPO
actor); each saved model is then reloaded and its logits checked finite. A run passes when it exits
0 and every loss it logged is finite."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from marlhf.gpu_check.config import Sizes
from marlhf.models.reward_model import load_reward_model
from marlhf.pipeline.demo import ROOT


@dataclass
class RunResult:
    """One process of the acceptance run."""

    name: str
    ok: bool
    wall_s: float
    returncode: int
    peak: dict = field(default_factory=dict)  # marlhf.gpu_check.runner's figures
    metrics: dict = field(default_factory=dict)  # the last logged row (training runs)
    problems: list[str] = field(default_factory=list)
    log: str = ""


def run_process(
    name: str, program: list[str], work: Path, timeout_s: int, env: dict | None = None
) -> RunResult:
    """``program`` (``["-m", MODULE, *args]`` or ``[SCRIPT, *args]``) under the runner; its output in
    ``work/logs/NAME.log``, its peak memory in ``work/logs/NAME.peak.json``."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    peak_file, log_file = logs / f"{name}.peak.json", logs / f"{name}.log"
    cmd = [sys.executable, "-m", "marlhf.gpu_check.runner", str(peak_file), *program]
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        try:
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, env=env
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.perf_counter() - t0
    peak = json.loads(peak_file.read_text()) if peak_file.exists() else {}
    res = RunResult(name, rc == 0, wall, rc, peak, log=str(log_file))
    if rc != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-15:]
        res.problems.append(f"exit {rc}" + (" (timed out)" if rc == 124 else "") + ": " +
                            " | ".join(tail))  # fmt: skip
    return res


def drop_train_state(run_dir: Path) -> None:
    """Removes a finished run's resumable state (``train_state/``): later runs load only its model,
    and at 0.9 B parameters the state (bf16 weights, float32 master weights and Adam moments: 14
    bytes a parameter) takes 12.6 GB a model, more than a GPU machine's disk holds for eight runs."""
    shutil.rmtree(run_dir / "train_state", ignore_errors=True)


def check_metrics(res: RunResult, metrics_file: Path) -> RunResult:
    """Reads a training run's metrics.jsonl: every ``loss*`` value finite, at least one row."""
    if not metrics_file.exists():
        if res.ok:
            res.problems.append(f"{metrics_file} was not written")
            res.ok = False
        return res
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    if not rows:
        res.problems.append(f"{metrics_file}: no row")
        res.ok = False
        return res
    for row in rows:
        for k, v in row.items():
            if k.startswith(("loss", "train/loss", "eval/loss")) and not math.isfinite(float(v)):
                res.problems.append(f"step {row.get('step')}: {k} = {v}")
                res.ok = False
    res.metrics = rows[-1]
    return res


def _common(work: Path, sizes: Sizes) -> list[str]:
    return [
        "--data_path", "synthetic-tldr", "--data_output_path", str(work / "data_cache"),
        "--dtype", "bf16", "--disable_progress_bar", "--seed", "1234",
    ]  # fmt: skip


def training_runs(work: Path, model: str, sizes: Sizes) -> list[tuple[str, list[str], Path]]:
    """(name, program, output dir) of each training run, in order."""
    c, s = _common(work, sizes), str(sizes.steps)
    tb, gb = str(sizes.train_batch), str(sizes.generation_batch)
    sft_rm = ["--max_seq_len", str(sizes.seq), "--per_device_train_batch_size", tb,
              "--per_device_eval_batch_size", tb, "--max_steps", s, "--eval_iters", "1"]  # fmt: skip
    ppo = [
        "--actor_model_name_or_path", str(work / "sft"),
        "--critic_model_name_or_path", str(work / "rm"),
        "--max_prompt_seq_len", str(sizes.prompt), "--max_answer_seq_len", str(sizes.answer),
        "--overlong_prompts", "truncate", "--per_device_generation_batch_size", gb,
        "--per_device_training_batch_size", tb, "--max_steps", s, "--log_phase_resources",
        "--actor_zero_stage", "2", "--critic_zero_stage", "2",
    ]  # fmt: skip
    # the CUDA-graphed decoder in one run (PPO n=1), the eager one in the others
    compiled = ["--compile_generation"] if sizes.device == "cuda" else []
    return [
        ("sft", ["-m", "marlhf.stages.sft", "--model_name_or_path", model, *c, *sft_rm,
                 "--zero_stage", "2", "--output_dir", str(work / "sft")], work / "sft"),
        ("rm", ["-m", "marlhf.stages.reward", "--model_name_or_path", str(work / "sft"), *c,
                *sft_rm, "--zero_stage", "2", "--output_dir", str(work / "rm")], work / "rm"),
        ("ppo_n1", ["-m", "marlhf.stages.ppo", *c, *ppo, *compiled, "--ngram", "1",
                    "--output_dir", str(work / "ppo_n1")], work / "ppo_n1"),
        ("mappo_n5_zero3", ["-m", "marlhf.stages.ppo", *c, *ppo, "--ngram", "5",
                            "--actor_zero_stage", "3", "--critic_zero_stage", "3",
                            "--output_dir", str(work / "mappo_n5_zero3")], work / "mappo_n5_zero3"),
        ("grpo_lora", ["-m", "marlhf.stages.ppo", *c, *ppo, "--advantage_estimator", "grpo",
                       "--n_samples_per_prompt", "4", "--reward_model_name_or_path",
                       str(work / "rm"), "--actor_lora_dim", "16", "--only_optimize_lora",
                       "--output_dir", str(work / "grpo_lora")], work / "grpo_lora"),
        ("macro_mc", ["-m", "marlhf.stages.ppo", *c, *ppo, "--advantage_estimator", "macro_mc",
                      "--reward_model_name_or_path", str(work / "rm"), "--mc_rollouts", "2",
                      "--mc_max_boundaries", "2", "--ngram", "5",
                      "--output_dir", str(work / "macro_mc")], work / "macro_mc"),
    ]  # fmt: skip


def inference_run(work: Path, sizes: Sizes) -> tuple[str, list[str], Path]:
    """Inference with rewards: the PPO actor's answers to held-out prompts, scored by the RM."""
    out = work / "inference" / "ppo_n1.jsonl"
    program = [
        str(ROOT / "inference" / "inference_with_rewards.py"), "--proj-path", str(work),
        "--dataset", "synthetic", "--model", str(work / "ppo_n1" / "actor"),
        "--reward-model", str(work / "rm"), "--num-samples", str(2 * sizes.generation_batch),
        "--batch-size", str(sizes.generation_batch), "--max-new-tokens", str(sizes.answer),
        "--max-prompt-len", str(sizes.prompt), "--dtype", "bf16", "--disable_progress_bar",
        "--output", str(out),
    ]  # fmt: skip
    return "inference", program, out


def check_inference(res: RunResult, out: Path) -> RunResult:
    """Every answer has a finite reward."""
    if not res.ok:
        return res
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    bad = [r.get("prompt_id") for r in rows if not math.isfinite(float(r["reward"]))]
    if not rows or bad:
        res.ok = False
        res.problems.append(f"{out}: {len(rows)} rows, non-finite rewards for {bad[:5]}")
    res.metrics = {
        "rows": len(rows),
        "reward_mean": sum(r["reward"] for r in rows) / max(1, len(rows)),
    }
    return res


def reload_checks(work: Path) -> list[str]:
    """Each saved causal LM (SFT, the PPO actors) reloads with ``from_pretrained`` and gives finite
    logits; the reward model reloads with :func:`marlhf.models.reward_model.load_reward_model`."""
    from transformers import AutoModelForCausalLM

    problems = []
    ids = torch.tensor([[2, 10, 11, 12, 13]])
    for d in ("sft", "ppo_n1/actor", "mappo_n5_zero3/actor", "grpo_lora/actor", "macro_mc/actor"):
        path = work / d
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            if not torch.isfinite(logits).all():
                problems.append(f"{path}: non-finite logits after reload")
        except Exception as e:  # a report, not a crash: the other checks still run
            problems.append(f"{path}: {type(e).__name__}: {e}")
    try:
        rm, _ = load_reward_model(work / "rm", dtype=torch.float32)
        with torch.no_grad():
            if not torch.isfinite(rm(input_ids=ids, attention_mask=None)).all():
                problems.append(f"{work / 'rm'}: non-finite values after reload")
    except Exception as e:
        problems.append(f"{work / 'rm'}: {type(e).__name__}: {e}")
    return problems


def run_pipeline(
    work: Path,
    model: str,
    sizes: Sizes,
    timeout_s: int,
    on_run: Callable[[list[RunResult]], None] | None = None,
) -> list[RunResult]:
    """Every run in order (a run whose input is missing fails with its own error), then inference
    and the reload checks (reported as a run named ``reload``). ``on_run(results so far)`` is
    called after each run."""
    env = dict(os.environ)
    results = []
    for name, program, out in training_runs(work, model, sizes):
        res = run_process(name, program, work, timeout_s, env)
        results.append(check_metrics(res, out / "metrics.jsonl"))
        drop_train_state(out)
        if on_run is not None:
            on_run(results)
    name, program, out = inference_run(work, sizes)
    results.append(check_inference(run_process(name, program, work, timeout_s, env), out))
    t0 = time.perf_counter()
    problems = reload_checks(work)
    results.append(
        RunResult("reload", not problems, time.perf_counter() - t0, 0, problems=problems)
    )
    return results
