"""PPO step throughput: our MA-PPO stage vs TRL's PPO trainer, same model shape, batch and lengths.

    .venv/bin/python benchmarks/bench_ppo.py                      # tiny Gemma on CPU (~1–2 min)
    python benchmarks/bench_ppo.py --gpu 0.1b --arch llama        # random 0.1 B Llama on a GPU, bf16

Ours runs as a subprocess (`python -m marlhf.stages.ppo`, real DeepSpeed, fixed 5-gram macro actions)
and is timed from the `time/*` metrics it writes to `metrics.jsonl`. TRL 1.12.0
(`trl.experimental.ppo`, the last release with PPO; a benchmark-only install:
`pip install --no-deps trl==1.12.0`) runs in a second subprocess on the same prompts (the stage's
own prompt dataset), the same policy / reference / value / reward shapes (value and reward are
`AutoModelForSequenceClassification` on the policy's backbone), the same rollout batch, minibatch and
response length, one PPO epoch, sampling at temperature 0.8 with no top-k / top-p (TRL's setting).

Prints, per system, the median seconds per PPO step over steps 2..N (step 1 is warm-up) and nominal
rollout tokens/s = rows × `--response` / step seconds; for ours also the split into
generate / score / macro / train and the macro overhead (time/macro ÷ time/step); then ours / TRL.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# random-initialised shapes for a GPU session: hidden × layers (heads of 64)
GPU_SHAPES = {"0.1b": (768, 12), "0.5b": (1536, 16), "1b": (2048, 16)}
GPU_VOCAB = 32000
PHASES = ("generate", "score", "macro", "train")


def _env(home: Path) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        MARLHF_HOME=str(home),
        TOKENIZERS_PARALLELISM="false",
        TRL_EXPERIMENTAL_SILENCE="1",
    )
    if not env.get("CUDA_VISIBLE_DEVICES") and not _cuda():
        env["DS_ACCELERATOR"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def build_models(work: Path, gpu: str | None, arch: str) -> tuple[Path, Path]:
    """The actor directory (tiny Gemma, or a random GPU-size shape with the tiny tokenizer) and a
    reward-model directory with a fresh head on the actor's backbone."""
    import torch
    from transformers import AutoTokenizer

    from marlhf.reward_model import RewardModel, save_reward_model
    from marlhf.tiny import build_tiny

    actor = build_tiny(work / "actor")
    if gpu is not None:
        from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

        hidden, layers = GPU_SHAPES[gpu]
        tok = AutoTokenizer.from_pretrained(actor)
        common = dict(
            vocab_size=GPU_VOCAB,
            hidden_size=hidden,
            intermediate_size=hidden * 8 // 3 // 64 * 64,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 64,
            num_key_value_heads=hidden // 64,
            head_dim=64,
            max_position_embeddings=2048,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )
        torch.manual_seed(0)
        model = (
            GemmaForCausalLM(GemmaConfig(**common))
            if arch == "gemma"
            else LlamaForCausalLM(LlamaConfig(**common))
        )
        model.generation_config.pad_token_id = tok.pad_token_id
        model.save_pretrained(actor)
        del model
    torch.manual_seed(0)
    rm = RewardModel.from_pretrained(actor)
    save_reward_model(
        rm,
        AutoTokenizer.from_pretrained(actor),
        work / "rm",
        score_stats={"mean": 0.0, "std": 1.0},
    )
    return actor, work / "rm"


def run_ours(args, work: Path, actor: Path, rm: Path) -> dict:
    out = work / "ours"
    cmd = [
        sys.executable,
        "-m",
        "marlhf.stages.ppo",
        "--actor_model_name_or_path",
        str(actor),
        "--critic_model_name_or_path",
        str(rm),
        "--data_output_path",
        str(work / "cache"),
        "--max_prompt_seq_len",
        str(args.prompt),
        "--max_answer_seq_len",
        str(args.response),
        "--per_device_generation_batch_size",
        str(args.batch),
        "--per_device_training_batch_size",
        str(args.minibatch),
        "--ppo_epochs",
        "1",
        "--max_steps",
        str(args.steps),
        "--temperature",
        "0.8",
        "--top_k",
        "0",
        "--termination_condition",
        "fixed",
        "--ngram",
        "5",
        "--dtype",
        args.dtype,
        "--output_dir",
        str(out),
        "--disable_progress_bar",
        *args.ours_extra,
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(work), capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": (proc.stdout[-1500:] + proc.stderr[-3000:]).strip()}
    from marlhf.tracking import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    timed = rows[1:] if len(rows) > 1 else rows  # step 1 pays one-off costs
    res = {"steps": len(rows), "wall_s": round(wall, 1)}
    res["step_s"] = statistics.median(r["time/step"] for r in timed)
    for ph in PHASES:
        res[f"{ph}_s"] = statistics.median(r[f"time/{ph}"] for r in timed)
    res["response_len_mean"] = statistics.mean(r["response/length"] for r in rows)
    res["macro_fraction"] = res["macro_s"] / res["step_s"]
    return res


def run_trl(args, work: Path, actor: Path) -> dict:
    spec = {
        "actor": str(actor),
        "cache": str(work / "cache"),
        "out": str(work / "trl"),
        "batch": args.batch,
        "minibatch": args.minibatch,
        "prompt": args.prompt,
        "response": args.response,
        "steps": args.steps,
        "bf16": args.dtype == "bf16",
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_trl_worker", json.dumps(spec)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(work), capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stdout[-1500:] + proc.stderr[-3000:]).strip()}
    res = json.loads(lines[-1])
    res["wall_s"] = round(wall, 1)
    return res


def trl_worker(spec: dict) -> None:
    """Runs in its own process: TRL's PPO trainer on the stage's prompts."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from marlhf.data.config import DataConfig
    from marlhf.data.tokenize import build_prompt_dataset

    tok = AutoTokenizer.from_pretrained(spec["actor"])
    tok.padding_side = "left"
    B, steps = spec["batch"], spec["steps"]
    prompts, _ = build_prompt_dataset(
        DataConfig(data_output_path=spec["cache"]), tok, "train", 1234, spec["prompt"], phase=3
    )
    if len(prompts) < B * steps:
        raise SystemExit(f"{len(prompts)} prompts, need {B * steps}")
    ids = [list(map(int, prompts[i]["input_ids"])) for i in range(B * steps)]
    dataset = Dataset.from_dict({"input_ids": ids})
    dtype = torch.bfloat16 if spec["bf16"] else torch.float32
    policy = AutoModelForCausalLM.from_pretrained(spec["actor"], dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(spec["actor"], dtype=dtype)
    value = AutoModelForSequenceClassification.from_pretrained(
        spec["actor"], num_labels=1, dtype=dtype
    )
    reward = AutoModelForSequenceClassification.from_pretrained(
        spec["actor"], num_labels=1, dtype=dtype
    )
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    config = PPOConfig(
        output_dir=spec["out"],
        # TRL's rollout is per_device_train_batch_size × gradient_accumulation_steps rows, split
        # into num_mini_batches optimiser steps: B rows, B / minibatch steps of `minibatch` rows
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        num_mini_batches=B // spec["minibatch"],
        num_ppo_epochs=1,
        total_episodes=B * steps,
        local_rollout_forward_batch_size=B,
        response_length=spec["response"],
        temperature=0.8,
        bf16=spec["bf16"],
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
        save_strategy="no",
        num_sample_generations=0,
        learning_rate=1e-5,
        stop_token=None,
        missing_eos_penalty=None,
        logging_steps=10_000,
        dataloader_num_workers=0,
    )
    trainer = PPOTrainer(
        args=config,
        processing_class=tok,
        model=policy,
        ref_model=ref,
        reward_model=reward,
        train_dataset=dataset,
        value_model=value,
        callbacks=[Stamp()],
    )
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    diffs = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    step_s = statistics.median(diffs) if diffs else total / max(1, len(stamps))
    print(json.dumps({"steps": len(stamps), "step_s": step_s, "total_s": round(total, 2)}))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", choices=tuple(GPU_SHAPES), default=None, help="GPU-size random model")
    p.add_argument("--arch", choices=("gemma", "llama"), default="gemma", help="with --gpu")
    p.add_argument("--batch", type=int, default=None, help="rollout rows (CPU 8, GPU 64)")
    p.add_argument(
        "--minibatch", type=int, default=None, help="training micro-batch (CPU 4, GPU 16)"
    )
    p.add_argument("--prompt", type=int, default=160, help="--max_prompt_seq_len")
    p.add_argument("--response", type=int, default=None, help="response tokens (CPU 16, GPU 128)")
    p.add_argument("--steps", type=int, default=6, help="PPO steps per system (first is warm-up)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="CPU fp32, GPU bf16")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--workdir", default=None, help="keep models and outputs here")
    p.add_argument(
        "--ours-extra", nargs=argparse.REMAINDER, default=[], help="extra flags for our stage"
    )
    p.add_argument("--_trl_worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._trl_worker is not None:
        trl_worker(json.loads(args._trl_worker))
        return {}
    gpu = args.gpu is not None
    args.batch = args.batch or (64 if gpu else 8)
    args.minibatch = args.minibatch or (16 if gpu else 4)
    args.response = args.response or (128 if gpu else 16)
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    if args.batch % args.minibatch:
        raise SystemExit("--batch must be a multiple of --minibatch")

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_ppo_"))
    work.mkdir(parents=True, exist_ok=True)
    actor, rm = build_models(work, args.gpu, args.arch)
    shape = args.gpu or "tiny gemma (128 x 2)"
    print(
        f"model {shape}, rollout {args.batch} rows, minibatch {args.minibatch}, prompt <= "
        f"{args.prompt}, response {args.response}, {args.steps} steps, {args.dtype}"
    )
    res: dict = {"model": shape, **{k: getattr(args, k) for k in ("batch", "minibatch")}}
    res.update(prompt=args.prompt, response=args.response, dtype=args.dtype)
    tokens = args.batch * args.response
    ours = run_ours(args, work, actor, rm)
    res["ours"] = ours
    if "error" in ours:
        print("ours FAILED:\n" + ours["error"])
    else:
        ours["tok_s"] = tokens / ours["step_s"]
        split = "  ".join(f"{ph} {ours[f'{ph}_s']:.3f}" for ph in PHASES)
        print(
            f"ours  {ours['step_s']:.3f} s/step  {ours['tok_s']:.1f} tok/s  ({split} s; "
            f"mean response {ours['response_len_mean']:.1f} tokens)"
        )
        print(f"macro overhead: time/macro = {100 * ours['macro_fraction']:.2f}% of the step")
    if not args.skip_trl:
        trl = run_trl(args, work, actor)
        res["trl"] = trl
        if "error" in trl:
            print("TRL FAILED:\n" + trl["error"])
        else:
            trl["tok_s"] = tokens / trl["step_s"]
            print(f"trl   {trl['step_s']:.3f} s/step  {trl['tok_s']:.1f} tok/s")
            if "error" not in ours:
                res["ours_over_trl_tok_s"] = ours["tok_s"] / trl["tok_s"]
                print(f"ours / TRL throughput: {res['ours_over_trl_tok_s']:.2f}x")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
