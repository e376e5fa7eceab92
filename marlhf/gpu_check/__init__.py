"""The GPU acceptance run: ``python -m marlhf.gpu_check [--output_dir DIR]`` (``make gpu-check``).

What a user with a GPU runs first, and the first thing to run on any GPU the project gets: on one
80 GB H100 the benchmark parts take about 4.5 minutes and the pipeline at ``--size 512x4`` about 4
(docs/gpu.md, "Time"), no network, one JSON (``DIR/gpu_check.json``) and one markdown table
(``DIR/gpu_check.md``). Parts (``--parts``):

- ``environment``: Python, torch, CUDA, cuDNN, the driver, the GPU and its memory and bandwidth,
  deepspeed, transformers and the other libraries' versions, the scaled-dot-product-attention
  kernels that run a bf16 causal attention (flash, memory-efficient, cuDNN, math) and the attention
  implementation transformers picks;
- ``pipeline`` (`marlhf.gpu_check.pipeline`): on a random-initialised Gemma-architecture model of
  about 0.9 B parameters (``--size``; config only, nothing downloaded), each stage as its own
  process for ``--steps`` steps in bf16: SFT and the reward model (ZeRO-2), PPO n=1 (ZeRO-2),
  MA-PPO n=5 (ZeRO-3), GRPO with a LoRA actor, macro_mc, inference with rewards; losses finite,
  each checkpoint reloaded by the next run and once more at the end; each run's peak memory;
- ``decode`` (`marlhf.gpu_check.probes`): tokens/s of HF ``generate`` and of the static decoder
  (eager and ``--compile_generation``) at batch 64 × 128 new tokens on TRL's 934 M benchmark policy,
  each as a fraction of the bound that reading the weights and the KV cache once per step at the
  GPU's bandwidth sets (goal: the compiled decoder at ≥ 50 %);
- ``ppo_update`` (`marlhf.gpu_check.bench`): seconds per PPO update at 934 M parameters (hidden
  2048 × 16 layers, batch 64, 128 + 128 tokens) next to TRL 1.12's 9.52 s on one H100 (goal:
  ≤ 1.9 s), with each phase's time and peak memory;
- ``mismatch``: the bf16 rollout–trainer log-prob mismatch (`marlhf.algo.mismatch`) of the pipeline
  model, batch 64 × 128 tokens.

Without a GPU it runs at CPU size by itself (the embedded tiny model, one step each, small
benchmark shapes: a few minutes on 2 cores); the test suite runs it that way. The figures of a GPU
run go to ``docs/gpu.md``.

On a GPU machine without deepspeed and datasets (e.g. torch 2.11 + CUDA 13 and transformers 5.17
preinstalled, no network), docs/gpu.md ("Preparing a bare GPU machine") gives the wheels to carry and the
install line; then, from the repository root::

    PYTHONPATH=/tmp/site:$PWD python3 -m marlhf.gpu_check --output_dir output/gpu_check

The exit status is 0 when every check passed (goals not met are reported, never failures), 1
otherwise.
"""

from __future__ import annotations

import gc
import resource
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from marlhf.cli import parse_config
from marlhf.gpu_check.bench import ppo_update_bench
from marlhf.gpu_check.config import GPUCheckStageConfig, resolve_sizes
from marlhf.gpu_check.environment import bandwidth_of, environment
from marlhf.gpu_check.models import bench_models, pipeline_model
from marlhf.gpu_check.pipeline import run_pipeline
from marlhf.gpu_check.probes import decode_throughput, rollout_mismatch
from marlhf.gpu_check.report import write
from marlhf.models.load import resolve_model_path


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> dict:
    if not torch.cuda.is_available():
        return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return {"peak_cuda_allocated_mb": torch.cuda.max_memory_allocated() / 2**20}


def _load(path: Path, device: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return model.to(device).eval()


def run_check(cfg, on_part: Callable[[dict], None] | None = None) -> dict:
    """Every part of ``cfg.parts`` in the order given; a part that raises is reported under
    ``errors`` and the others still run. ``on_part(result)`` is called after each part (``main``
    writes the files then, so a run stopped part-way keeps what it measured). Returns the result
    (see :mod:`marlhf.gpu_check.report`)."""
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available()
    sizes = resolve_sizes(cfg, cuda)
    out = Path(cfg.output_dir).resolve()
    work = out / "runs"
    result: dict = {"config": asdict(cfg), "sizes": asdict(sizes), "errors": {}}
    env = environment()
    if "environment" in cfg.parts:
        result["environment"] = env
    bandwidth = cfg.bandwidth or bandwidth_of(env.get("gpu") or "")
    model_dir: Path | None = None
    bench_dir = work / "bench"

    def part(name: str, fn) -> None:
        if name not in cfg.parts:
            return
        _free()
        start = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as e:  # reported; the other parts still run
            result["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        result.setdefault("part_seconds", {})[name] = time.perf_counter() - start
        result.setdefault("part_peak", {})[name] = _peak()
        _free()
        result["wall_s"] = time.perf_counter() - t0
        if on_part is not None:
            on_part(result)

    def pipeline():
        nonlocal model_dir
        model_dir = _pipeline_model(work, sizes, pipeline_model)

        def so_far(runs) -> None:  # each finished run is written while the next one runs
            result["pipeline"] = [asdict(r) for r in runs]
            if on_part is not None:
                on_part(result)

        runs = run_pipeline(work, str(model_dir), sizes, cfg.stage_timeout_s, on_run=so_far)
        return [asdict(r) for r in runs]

    def decode():
        actor = bench_dir / "models" / "actor"
        if not (actor / "config.json").exists():
            bench_models(bench_dir / "models", sizes.bench_hidden, sizes.bench_layers,
                         sizes.bench_vocab, sizes.device)  # fmt: skip
        model = _load(actor, sizes.device)
        res = decode_throughput(
            model, sizes.bench_batch, sizes.bench_prompt, sizes.bench_new_tokens, bandwidth
        )
        del model
        return res

    def ppo_update():
        res, run = ppo_update_bench(bench_dir, sizes, cfg.stage_timeout_s)
        res["run"] = asdict(run)
        if not run.ok:
            raise RuntimeError("; ".join(run.problems))
        return res

    def mismatch():
        path = model_dir or _pipeline_model(work, sizes, pipeline_model)
        model = _load(path, sizes.device)
        res = rollout_mismatch(model, sizes.bench_batch, sizes.bench_prompt, sizes.bench_new_tokens)
        del model
        return res

    parts = {"pipeline": pipeline, "decode": decode, "ppo_update": ppo_update,
             "mismatch": mismatch}  # fmt: skip
    for name in cfg.parts:
        if name in parts:
            part(name, parts[name])
    pipeline_ok = all(r["ok"] for r in result.get("pipeline", []))
    result["ok"] = not result["errors"] and pipeline_ok
    result["wall_s"] = time.perf_counter() - t0
    return result


def _pipeline_model(work: Path, sizes, build) -> Path:
    """The pipeline's model: the embedded tiny model at CPU size, else a random Gemma (built once)."""
    if sizes.model is None:
        return Path(resolve_model_path("tiny"))
    path = work / f"gemma-{sizes.model[0]}x{sizes.model[1]}"
    if not (path / "config.json").exists():
        build(path, *sizes.model, sizes.device)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(GPUCheckStageConfig, argv, description=__doc__.splitlines()[0]).check
    result = run_check(cfg, on_part=lambda partial: write(partial, Path(cfg.output_dir)))
    js, md = write(result, Path(cfg.output_dir))
    print(md.read_text())
    print(f"gpu_check: {js} and {md}", file=sys.stderr)
    return 0 if result["ok"] else 1
