"""The PPO-update benchmark: TRL 1.12's shapes (``../shared/anchors/trl_ppo_bench.py``) through
``marlhf.stages.ppo``: a Llama policy and a reward model of the same shape (the critic starts from
it), rollout batch 64, prompts of 128 tokens, 128 sampled tokens (temperature 0.8, no top-k), one
PPO epoch of 4 minibatches, bf16. One update = generate + score + estimate + train, the quantity
TRL's per-update time measures (9.52 s at 934 M on one H100, November 2026)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from marlhf.gpu_check.config import Sizes
from marlhf.gpu_check.models import bench_models, param_count, random_prompts
from marlhf.gpu_check.pipeline import RunResult, check_metrics, drop_train_state, run_process

TRL_SECONDS = {"934M": 9.52, "134M": 4.38}  # TRL 1.12 PPO update, one H100 (gpu-anchors.md)
GOAL_SECONDS_934M = 1.9  # >= 5x TRL


def _run(work: Path, program: list[str], timeout_s: int) -> RunResult:
    """One benchmark run from scratch (its output directory removed first)."""
    shutil.rmtree(work / "ppo", ignore_errors=True)
    res = run_process("ppo_update", program, work, timeout_s)
    return check_metrics(res, work / "ppo" / "metrics.jsonl")


def ppo_update_bench(work: Path, sizes: Sizes, timeout_s: int) -> tuple[dict, RunResult]:
    """Builds the models and prompts, runs ``sizes.bench_steps`` PPO steps and returns the median
    seconds per update over the steps after the first (compilation, warm-up), the phases' times and
    peak memory (``--log_phase_resources``), and the run's :class:`RunResult`."""
    actor, rm = bench_models(
        work / "models", sizes.bench_hidden, sizes.bench_layers, sizes.bench_vocab, sizes.device
    )
    B, steps = sizes.bench_batch, sizes.bench_steps
    # prompts of bench_prompt tokens with BOS: one word fewer
    data = random_prompts(
        work / "prompts.jsonl", 2 * B * steps, sizes.bench_prompt - 1, sizes.bench_vocab
    )
    program = [
        "-m", "marlhf.stages.ppo", "--actor_model_name_or_path", str(actor),
        "--critic_model_name_or_path", str(rm), "--data_path", str(data), "--data_split", "0,0,1",
        "--data_output_path", str(work / "data_cache"), "--max_prompt_seq_len",
        str(sizes.bench_prompt), "--overlong_prompts", "truncate", "--max_answer_seq_len",
        str(sizes.bench_new_tokens), "--per_device_generation_batch_size", str(B),
        "--per_device_training_batch_size", str(max(1, B // 4)), "--ppo_epochs", "1",
        "--temperature", "0.8", "--top_k", "0", "--dtype", "bf16", "--max_steps", str(steps),
        "--log_phase_resources", "--disable_progress_bar", "--output_dir", str(work / "ppo"),
        "--length_group_call_tokens", "4096",
    ]  # fmt: skip
    compiled = sizes.device == "cuda"
    res = _run(work, program + ["--compile_generation"] * compiled, timeout_s)
    if compiled and not res.ok:  # the CUDA-graphed decoder failed: measure with the eager one
        failed = res
        res = _run(work, program, timeout_s)
        res.problems.insert(0, "--compile_generation failed: " + "; ".join(failed.problems))
        compiled = False
    drop_train_state(work / "ppo")
    rows = []
    metrics_file = work / "ppo" / "metrics.jsonl"
    if metrics_file.exists():
        rows = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip()]
    params = param_count(actor)
    out = {"params": params, "batch": B, "prompt": sizes.bench_prompt, "compile_generation": compiled,
           "new_tokens": sizes.bench_new_tokens, "steps": len(rows)}  # fmt: skip
    timed = rows[1:] or rows
    if timed:
        out["seconds_per_update"] = statistics.median(r["time/step"] for r in timed)
        out["phases_s"] = {k: statistics.median(r[k] for r in timed)
                           for k in timed[0] if k.startswith("time/")}  # fmt: skip
        out["peak_mb"] = {k: max(r[k] for r in rows) for k in rows[0] if k.startswith("mem/")}
        out["response_length"] = statistics.mean(r["response/length"] for r in rows)
    size = "934M" if (sizes.bench_hidden, sizes.bench_layers) == (2048, 16) else None
    if size and "seconds_per_update" in out:
        out["trl_seconds"] = TRL_SECONDS[size]
        out["speedup_vs_trl"] = TRL_SECONDS[size] / out["seconds_per_update"]
        out["goal_seconds"] = GOAL_SECONDS_934M
        out["goal_met"] = out["seconds_per_update"] <= GOAL_SECONDS_934M
    return out, res
