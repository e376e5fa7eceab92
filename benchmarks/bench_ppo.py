"""PPO step cost vs answer length: our MA-PPO stage and TRL's PPO trainer side by side, one run.

    .venv/bin/python benchmarks/bench_ppo.py                      # tiny Gemma on CPU, answers 16/64/256
    .venv/bin/python benchmarks/bench_ppo.py --responses 64 --batch 16 --minibatch 8 --skip-trl
    python benchmarks/bench_ppo.py --gpu 1b --responses 128 512    # random 1 B Gemma on a GPU, bf16

For each answer length (``--responses``), ours runs as a subprocess (`python -m marlhf.stages.ppo`,
real DeepSpeed, fixed 5-gram macro actions, ``--log_phase_resources``) and is timed from the
``time/*`` / ``time_cpu/*`` / ``mem/*`` metrics it writes to `metrics.jsonl`; then TRL 1.12.0
(`trl.experimental.ppo`, the last release with PPO; a benchmark-only install:
`pip install --no-deps trl==1.12.0`) runs in a second subprocess on the same prompts (the stage's
own prompt dataset), the same policy / reference / value / reward shapes (value and reward are
`AutoModelForSequenceClassification` on the policy's backbone), the same rollout batch, minibatch
and response length, one PPO epoch, sampling at temperature 0.8 with no top-k / top-p (TRL's
setting). TRL has no stop token here, so its answers are always ``--response`` tokens; ours stop at
EOS (the mean length is printed).

With ``--rounds R`` (default 3) each length runs R times per system, alternating which system goes
first, and a ratio is taken per round from two adjacent runs, so a drift of the machine's speed over
the benchmark (a shared host's load, clock changes) falls on both systems alike; the printed ratio is
the median over rounds, with the rounds' range.

Prints, per length and system, the median seconds per PPO step over steps 2..N (step 1 is warm-up),
wall and CPU (``process_time``: on a shared machine the CPU time is the steadier figure, since wall
time also counts the time other processes held the cores), our split into generate / score /
macro / train, the peak RSS per phase (TRL: generate, score, train, found by wrapping its
``batch_generation`` and its first gradient-enabled ``forward``; CUDA peaks too on a GPU), and the
ratios TRL / ours measured in the same run. Writes a plot of s/step vs answer length (``--plot``,
PNG) and prints the machine's load average before and after. The last line is JSON.
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
# random-initialised shapes for a GPU run: hidden × layers (heads of 64)
GPU_SHAPES = {"0.1b": (768, 12), "0.5b": (1536, 16), "1b": (2048, 16)}
GPU_VOCAB = 32000
PHASES = ("generate", "score", "macro", "train")
TRL_PHASES = ("generate", "score", "train")


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

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

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


def run_ours(args, work: Path, actor: Path, rm: Path, shape: dict, k: int = 0) -> dict:
    """Our stage at one shape (``response``, ``batch``, ``minibatch``): medians over steps 2..N."""
    out = work / f"ours-{shape['response']}-r{k}"
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo",
        "--actor_model_name_or_path", str(actor), "--critic_model_name_or_path", str(rm),
        "--data_output_path", str(work / "cache"),
        "--max_prompt_seq_len", str(args.prompt), "--max_answer_seq_len", str(shape["response"]),
        "--per_device_generation_batch_size", str(shape["batch"]),
        "--per_device_training_batch_size", str(shape["minibatch"]),
        "--ppo_epochs", "1", "--max_steps", str(args.steps),
        "--temperature", "0.8", "--top_k", "0", "--termination_condition", "fixed", "--ngram", "5",
        "--dtype", args.dtype, "--output_dir", str(out), "--disable_progress_bar",
        "--log_phase_resources", *args.ours_extra,
    ]  # fmt: skip
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(work), capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": (proc.stdout[-1500:] + proc.stderr[-3000:]).strip()}
    from marlhf.runtime.tracking import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    timed = rows[1:] if len(rows) > 1 else rows  # step 1 pays one-off costs
    res = {"steps": len(rows), "wall_s": round(wall, 1)}
    res["step_s"] = statistics.median(r["time/step"] for r in timed)
    res["cpu_step_s"] = statistics.median(r["time_cpu/step"] for r in timed)
    for ph in PHASES:
        res[f"{ph}_s"] = statistics.median(r[f"time/{ph}"] for r in timed)
        res[f"{ph}_cpu_s"] = statistics.median(r[f"time_cpu/{ph}"] for r in timed)
        for mem in ("rss", "cuda"):
            key = f"mem/peak_{mem}_mb/{ph}"
            if key in timed[0]:
                res[f"{ph}_peak_{mem}_mb"] = max(r[key] for r in timed)
    res["response_len_mean"] = statistics.mean(r["response/length"] for r in rows)
    res["macro_fraction"] = res["macro_s"] / res["step_s"]
    return res


def run_trl(args, work: Path, actor: Path, shape: dict, k: int = 0) -> dict:
    spec = {
        "actor": str(actor),
        "cache": str(work / "cache"),
        "out": str(work / f"trl-{shape['response']}-r{k}"),
        "prompt": args.prompt,
        "steps": args.steps,
        "bf16": args.dtype == "bf16",
        **shape,
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


class _TrlPhases:
    """Wall, CPU and peak RSS of TRL's phases: generate (``batch_generation``), score (until the
    first gradient-enabled ``forward``), train (until the step ends)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.steps: list[dict] = []
        self.current: dict = {}

    def begin(self, phase: str) -> None:
        from marlhf.runtime.resources import PhaseResources

        self.end()
        self.phase, self.res, self.t0 = phase, PhaseResources(), time.perf_counter()
        self.res.start()

    def end(self) -> None:
        import torch

        if self.phase is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.res.stop(self.phase)
        self.current[f"{self.phase}_s"] = time.perf_counter() - self.t0
        for k, v in self.res.metrics.items():
            kind, _, name = k.rpartition("/")
            key = {"time_cpu": "cpu_s", "mem/peak_rss_mb": "peak_rss_mb"}.get(kind, "peak_cuda_mb")
            self.current[f"{name}_{key}"] = v
        self.phase = None

    def step_end(self) -> None:
        self.end()
        self.steps.append(self.current)
        self.current = {}

    def install(self, module) -> None:
        import torch

        gen, fwd = module.batch_generation, module.forward

        def batch_generation(*a, **k):
            self.begin("generate")
            try:
                return gen(*a, **k)
            finally:
                self.begin("score")

        def forward(*a, **k):
            if self.phase == "score" and torch.is_grad_enabled():
                self.begin("train")
            return fwd(*a, **k)

        module.batch_generation, module.forward = batch_generation, forward


def trl_worker(spec: dict) -> None:
    """Runs in its own process: TRL's PPO trainer on the stage's prompts."""
    import torch
    import trl.experimental.ppo.ppo_trainer as trl_ppo
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
    stamps: list[tuple[float, float]] = []
    phases = _TrlPhases()
    phases.install(trl_ppo)

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            phases.step_end()
            stamps.append((time.perf_counter(), time.process_time()))

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
    walls = [b[0] - a[0] for a, b in zip(stamps, stamps[1:], strict=False)]
    cpus = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False)]
    res = {"steps": len(stamps), "total_s": round(total, 2)}
    res["step_s"] = statistics.median(walls) if walls else total / max(1, len(stamps))
    res["cpu_step_s"] = statistics.median(cpus) if cpus else float("nan")
    timed = phases.steps[1:] or phases.steps
    for key in sorted({k for st in timed for k in st}):
        vals = [st[key] for st in timed if key in st]
        res[key] = max(vals) if "peak" in key else statistics.median(vals)
    res["response_len_mean"] = float(spec["response"])
    print(json.dumps(res))


def shapes(args) -> list[dict]:
    """One (response, batch, minibatch) per answer length; a single --batch/--minibatch applies to
    every length."""

    def pick(values: list[int], i: int, default: int) -> int:
        if not values:
            return default
        return values[i] if len(values) == len(args.responses) else values[0]

    gpu, out = args.gpu is not None, []
    for i, r in enumerate(args.responses):
        batch = pick(args.batch, i, 64 if gpu else (8 if r <= 16 else 16))
        minibatch = pick(args.minibatch, i, 16 if gpu else batch // 2)
        if batch % minibatch:
            raise SystemExit(f"--batch {batch} must be a multiple of --minibatch {minibatch}")
        out.append({"response": r, "batch": batch, "minibatch": minibatch})
    return out


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["response"] for r in results]
    for system, color in (("ours", "tab:blue"), ("trl", "tab:orange")):
        for key, style, what in (("step_s", "-o", "wall"), ("cpu_step_s", "--s", "CPU")):
            pts = [
                (x, r[system][key])
                for x, r in zip(xs, results, strict=True)
                if key in r.get(system, {})
            ]
            if pts:
                label = f"{'ours (MA-PPO)' if system == 'ours' else 'TRL 1.12 PPO'}, {what}"
                ax.plot(*zip(*pts, strict=True), style, color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("answer tokens")
    ax.set_ylabel("seconds per PPO step")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_mem(res: dict, phases) -> str:
    vals = [res.get(f"{ph}_peak_rss_mb") for ph in phases]
    text = "/".join(f"{v:.0f}" if v is not None else "-" for v in vals)
    cuda = [res.get(f"{ph}_peak_cuda_mb") for ph in phases]
    if any(v is not None for v in cuda):
        text += " (CUDA " + "/".join(f"{v:.0f}" if v is not None else "-" for v in cuda) + ")"
    return text


def merge_rounds(runs: list[dict]) -> dict:
    """One system's rounds at one length -> one result: the median of each timing over rounds, the
    largest peak memory, summed wall time and steps; the first error if any round failed."""
    for res in runs:
        if "error" in res:
            return res
    out = {}
    for key, value in runs[0].items():
        values = [res[key] for res in runs if key in res]
        if key in ("wall_s", "steps", "total_s"):
            out[key] = round(sum(values), 1)
        elif "peak" in key:
            out[key] = max(values)
        elif isinstance(value, int | float):
            out[key] = statistics.median(values)
        else:
            out[key] = value
    out["rounds"] = len(runs)
    return out


def round_ratios(ours: list[dict], trl: list[dict]) -> dict:
    """TRL / ours per round (adjacent runs): the median and range over rounds, wall and CPU."""
    pairs = [
        (o, t) for o, t in zip(ours, trl, strict=True) if "error" not in o and "error" not in t
    ]
    out = {}
    for key, name in (("step_s", "wall"), ("cpu_step_s", "cpu")):
        ratios = [t[key] / o[key] for o, t in pairs]
        if ratios:
            out[f"trl_over_ours_{name}"] = statistics.median(ratios)
            out[f"trl_over_ours_{name}_rounds"] = ratios
    return out


def report(shape: dict, ours: dict, trl: dict | None, ratios: dict | None = None) -> dict:
    """Print one answer length's lines (``ratios``: :func:`round_ratios`); returns the ratios."""
    r, ratios = shape["response"], ratios or {}
    head = f"answer {r:>4} (rows {shape['batch']}, minibatch {shape['minibatch']})"
    if "error" in ours:
        print(f"{head}: ours FAILED:\n{ours['error']}")
    else:
        split = " / ".join(f"{ours[f'{ph}_s']:.3f}" for ph in PHASES)
        print(
            f"{head}: ours {ours['step_s']:.3f} s/step wall, {ours['cpu_step_s']:.3f} CPU "
            f"(generate/score/macro/train {split}); mean answer {ours['response_len_mean']:.0f}; "
            f"peak RSS MB generate/score/macro/train {_fmt_mem(ours, PHASES)}"
        )
    if trl is None:
        return ratios
    if "error" in trl:
        print(f"{head}: TRL FAILED:\n{trl['error']}")
        return ratios
    split = " / ".join(f"{trl.get(f'{ph}_s', float('nan')):.3f}" for ph in TRL_PHASES)
    print(
        f"{head}: TRL  {trl['step_s']:.3f} s/step wall, {trl['cpu_step_s']:.3f} CPU "
        f"(generate/score/train {split}); answers {trl['response_len_mean']:.0f}; "
        f"peak RSS MB generate/score/train {_fmt_mem(trl, TRL_PHASES)}"
    )
    if "error" not in ours and ratios:

        def fmt(name: str) -> str:
            per = ratios[f"trl_over_ours_{name}_rounds"]
            spread = f" (rounds {min(per):.2f}-{max(per):.2f})" if len(per) > 1 else ""
            return f"{ratios[f'trl_over_ours_{name}']:.2f}x{spread}"

        n = len(ratios["trl_over_ours_wall_rounds"])
        print(
            f"{head}: ours is {fmt('wall')} TRL's speed (wall), {fmt('cpu')} (CPU)"
            + (f"; median of {n} rounds" if n > 1 else "")
        )
    return ratios


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", choices=tuple(GPU_SHAPES), default=None, help="GPU-size random model")
    p.add_argument("--arch", choices=("gemma", "llama"), default="gemma", help="with --gpu")
    p.add_argument(
        "--responses",
        type=int,
        nargs="+",
        default=None,
        help="answer lengths (CPU 16 64 256, GPU 128)",
    )
    p.add_argument(
        "--batch", type=int, nargs="+", default=[], help="rollout rows: one, or one per length "
        "(CPU 8 at <= 16 tokens else 16; GPU 64)",
    )  # fmt: skip
    p.add_argument(
        "--minibatch",
        type=int,
        nargs="+",
        default=[],
        help="training micro-batch (batch / 2; GPU 16)",
    )
    p.add_argument("--prompt", type=int, default=160, help="--max_prompt_seq_len")
    p.add_argument("--steps", type=int, default=5, help="PPO steps per run (the first is warm-up)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="CPU fp32, GPU bf16")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs per system and length, alternating (ratios per round)",
    )
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--workdir", default=None, help="keep models and outputs here")
    p.add_argument(
        "--plot", default=None, help="PNG of s/step vs answer length (default in workdir)"
    )
    p.add_argument(
        "--ours-extra", nargs=argparse.REMAINDER, default=[], help="extra flags for our stage"
    )
    p.add_argument("--_trl_worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._trl_worker is not None:
        trl_worker(json.loads(args._trl_worker))
        return {}
    gpu = args.gpu is not None
    args.responses = args.responses or ([128] if gpu else [16, 64, 256])
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    plan = shapes(args)

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_ppo_"))
    work.mkdir(parents=True, exist_ok=True)
    t_start, load_before = time.perf_counter(), os.getloadavg()
    actor, rm = build_models(work, args.gpu, args.arch)
    model = args.gpu or "tiny gemma (128 x 2)"
    print(
        f"model {model}, prompt <= {args.prompt}, {args.steps} steps per run, {args.dtype}; "
        f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
        f"on {os.cpu_count()} CPUs"
    )
    results = []
    for shape in plan:
        ours_runs, trl_runs = [], []
        for k in range(args.rounds):
            # alternate which system goes first, so neither always runs on a warmer machine
            order = ("ours", "trl") if k % 2 == 0 else ("trl", "ours")
            for system in order:
                if system == "ours":
                    ours_runs.append(run_ours(args, work, actor, rm, shape, k))
                elif not args.skip_trl:
                    trl_runs.append(run_trl(args, work, actor, shape, k))
        ours = merge_rounds(ours_runs)
        trl = None if args.skip_trl else merge_rounds(trl_runs)
        ratios = None if args.skip_trl else round_ratios(ours_runs, trl_runs)
        row = {**shape, "ours": ours, **({"trl": trl} if trl is not None else {})}
        row.update(report(shape, ours, trl, ratios))
        results.append(row)
    load_after = os.getloadavg()
    wall = time.perf_counter() - t_start
    print(
        f"benchmark wall time {wall:.0f} s; load average after {load_after[0]:.2f} "
        f"{load_after[1]:.2f} {load_after[2]:.2f}"
    )
    png = Path(args.plot) if args.plot else work / "bench_ppo.png"
    plot(results, png, f"PPO step vs answer length: {model}, {args.dtype}")
    print(f"plot: {png}")
    out = {
        "model": model, "prompt": args.prompt, "dtype": args.dtype, "steps": args.steps,
        "load_before": load_before, "load_after": load_after, "wall_s": round(wall, 1),
        "results": results,
    }  # fmt: skip
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
