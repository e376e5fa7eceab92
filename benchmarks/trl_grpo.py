"""A peer's GRPO on the same task: TRL's ``GRPOTrainer`` against this project's ``grpo`` arm on
``synthetic-verdict-64`` from ``tiny-base-64``, the task's gold scorer as the reward.

Pre-registered design (written before the first run). Both implementations get, per seed, the same
model, the same PPO prompts (the sweep's split: ``--data_split 0,6,4 --data_seed 1234``), the same
reward (the verdict-64 gold score of the decoded answer), G = 4 samples per prompt, 16 answers per
rollout (4 prompts), two optimizer steps of 8 answers per rollout and one pass (TRL:
``per_device_train_batch_size 8``, ``steps_per_generation 2``, ``num_iterations 1``; a TRL "step" is
one optimizer step, so ``max_steps`` is twice ours), actor learning rate 1e-4 constant, AdamW betas
(0.9, 0.95), no weight decay, gradient norm clipped at 1, clip range 0.2, T = 1 with no top-k / top-p,
at most 112 answer tokens, group-normalised advantages (std of the group), the token-mean loss over
each minibatch (TRL's ``dapo``, our ``token-mean``), and KL coefficient 0.01. What cannot be made
equal: TRL puts the KL in the loss (β · k3 per token, ``beta``) while our ``grpo`` puts it in the
reward (−0.01 · k1 per token, as return-to-go); TRL samples with ``model.generate`` and its own
seeding, ours with the static decoder and per-row seeds; the prompt order is each one's own draw.

Question: do the two GRPOs' training-gold curves agree within seed noise? Measured: per step, the
mean gold of the rollout's 16 answers; final = mean of the last 5 steps per seed; Welch 95 % interval
of the difference of the finals; per-step differences of the seed means against their 95 %
intervals; after training, 32 held-out prompts at T = 1 (gold, right openings: the sweep's
held-out measure); seconds and CPU seconds per step of each, measured in one invocation, one job at
a time. Prediction: agreement within noise (both are GRPO with the same settings).

Seeds 1-5, 30 steps (the sweep's grpo arm at 64 tokens)::

    bash benchmarks/make_trl_env.sh        # .venv-trl (trl 1.13.0, transformers 5.23.0)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trl_grpo.py --output_dir output/trl_grpo

Only analyse: ``--analyze_only``. The TRL side runs in ``.venv-trl`` (``--trl_python``); this script
itself runs in the project's ``.venv``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HORIZON, TASK = 64, "verdict"
G, ROLLOUT, MINIBATCH = 4, 16, 8
LR, KL, CLIP, ADAM_BETAS = 1e-4, 0.01, 0.2, (0.9, 0.95)
FINAL = 5


# --------------------------------------------------------------------------------------------------
# the TRL side (runs in .venv-trl)


def trl_worker(out: Path, seed: int, steps: int) -> None:
    """One TRL GRPO run; writes ``trl_run.json`` (the per-rollout gold curve, timings) and the
    final model under ``out / "actor"``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.horizon_sweep import DATA_FLAGS, SEQ
    from marlhf.data.config import DataConfig
    from marlhf.data.long_tasks import gold_scorer_for
    from marlhf.data.tokenize import build_prompt_dataset
    from marlhf.models.load import resolve_model_path

    torch.set_num_threads(1)
    name = f"synthetic-{TASK}-{HORIZON}"
    path = resolve_model_path(f"tiny-base-{HORIZON}")
    tok = AutoTokenizer.from_pretrained(path)
    data = DataConfig(
        data_path=(name,), data_split=DATA_FLAGS[1], data_seed=int(DATA_FLAGS[3]),
        data_output_path=str(out.parent / "data_cache"),
    )  # fmt: skip
    prompts, _ = build_prompt_dataset(data, tok, "train", seed, SEQ[HORIZON][0])
    # the same prompt tokens as ours (bos + prompt)
    assert tok(prompts[0]["prompt"])["input_ids"] == prompts[0]["input_ids"], "prompt tokens differ"
    gold = gold_scorer_for(name)
    curve: list[float] = []
    stamps: list[float] = []

    def gold_reward(prompts, completions, **kwargs):
        rewards = [float(gold(p, c)) for p, c in zip(prompts, completions, strict=True)]
        curve.append(statistics.fmean(rewards))  # one call per rollout of 16 answers
        stamps.append(time.perf_counter())
        return rewards

    args = GRPOConfig(
        output_dir=str(out / "trainer"), seed=seed, max_steps=2 * steps,
        per_device_train_batch_size=MINIBATCH, gradient_accumulation_steps=1,
        steps_per_generation=ROLLOUT // MINIBATCH, num_generations=G, num_iterations=1,
        max_completion_length=SEQ[HORIZON][1], temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=ADAM_BETAS[0], adam_beta2=ADAM_BETAS[1], max_grad_norm=1.0,
        beta=KL, epsilon=CLIP, loss_type="dapo", scale_rewards="group",
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=gold_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(prompts["prompt"])}),
        processing_class=tok,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    trainer.save_model(str(out / "actor"))
    tok.save_pretrained(str(out / "actor"))
    (out / "trl_run.json").write_text(
        json.dumps({"seed": seed, "steps": steps, "gold": curve, "train_s": wall, "cpu_s": cpu})
    )


# --------------------------------------------------------------------------------------------------
# the orchestration (runs in .venv)


def our_argv(out: Path, seed: int, steps: int) -> list[str]:
    """The PPO stage's flags of the sweep's ``grpo`` arm at 64 tokens (oracle reward)."""
    from benchmarks.horizon_sweep import DATA_FLAGS, PPO_FLAGS, SEQ, arm_flags

    return [
        *PPO_FLAGS, *DATA_FLAGS, *arm_flags("grpo", HORIZON),
        "--data_path", f"synthetic-{TASK}-{HORIZON}",
        "--max_prompt_seq_len", str(SEQ[HORIZON][0]),
        "--max_answer_seq_len", str(SEQ[HORIZON][1]),
        "--reward_source", "gold",
        "--actor_model_name_or_path", f"tiny-base-{HORIZON}",
        "--seed", str(seed), "--max_steps", str(steps),
        "--data_output_path", str(out.parent / "data_cache"),
        "--output_dir", str(out),
    ]  # fmt: skip


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(cmd: list[str], log: Path, env: dict) -> tuple[float, float]:
    """Run ``cmd`` to completion (output to ``log``); its wall and CPU seconds."""
    t0, c0 = time.perf_counter(), _child_cpu()
    with open(log, "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=True, cwd=ROOT)
    return time.perf_counter() - t0, _child_cpu() - c0


def execute(root: Path, seeds: list[int], steps: int, trl_python: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    from benchmarks.horizon_sweep import _held_out

    for seed in seeds:
        for impl in ("ours", "trl"):
            out = root / impl / f"seed{seed}"
            if (out / "run.json").exists():
                continue
            out.mkdir(parents=True, exist_ok=True)
            if impl == "ours":
                cmd = [sys.executable, "-m", "marlhf.stages.ppo", *our_argv(out, seed, steps)]
            else:
                cmd = [trl_python, str(Path(__file__).resolve()), "--_trl_worker", str(out),
                       "--seeds", str(seed), "--steps", str(steps)]  # fmt: skip
            wall, cpu = run_one(cmd, out / "log.txt", env)
            held = _held_out(out / "actor", TASK, HORIZON)
            # the whole run's wall and CPU seconds (start-up and final save included)
            rec = {"seed": seed, "impl": impl, "run_wall_s": wall, "run_cpu_s": cpu}
            rec["held_out"] = held
            if impl == "ours":
                from benchmarks.analysis import load_run

                m = load_run(out / "metrics.jsonl")
                rec.update(gold=m["gold"], train_s=sum(m["step_time"]))
            else:
                trl = json.loads((out / "trl_run.json").read_text())
                rec.update(gold=trl["gold"], train_s=trl["train_s"], train_cpu_s=trl["cpu_s"])
            (out / "run.json").write_text(json.dumps(rec, indent=1))
            print(f"[trl_grpo] {impl} seed {seed}: {wall:.0f} s wall, {cpu:.0f} CPU s", flush=True)


def analyze(root: Path, fig: Path | None) -> str:
    from benchmarks.analysis import final_value, mean_ci, pm, welch_diff_ci

    runs = {impl: {} for impl in ("ours", "trl")}
    for f in sorted(root.glob("*/seed*/run.json")):
        r = json.loads(f.read_text())
        runs[r["impl"]][r["seed"]] = r
    seeds = sorted(set(runs["ours"]) & set(runs["trl"]))
    if not seeds:
        return "no finished pair of runs"
    lines = [
        "| implementation | seeds | final training gold | held-out gold | right openings | "
        "s / step (wall) | CPU s / step |",
        "|---|---|---|---|---|---|---|",
    ]
    finals, held = {}, {}
    for impl in ("ours", "trl"):
        rs = [runs[impl][s] for s in seeds]
        finals[impl] = [final_value(r["gold"], FINAL) for r in rs]
        held[impl] = {k: [r["held_out"][k] for r in rs] for k in ("gold", "right_opening")}
        steps = [len(r["gold"]) for r in rs]
        name = {"ours": "marlhf grpo", "trl": "TRL 1.13 GRPOTrainer"}[impl]
        lines.append(
            f"| {name} | {len(rs)} | {pm(mean_ci(finals[impl]))} | "
            f"{pm(mean_ci(held[impl]['gold']))} | {pm(mean_ci(held[impl]['right_opening']), 2)} | "
            f"{statistics.fmean(r['train_s'] / n for r, n in zip(rs, steps, strict=True)):.2f} | "
            f"{statistics.fmean(r['run_cpu_s'] / n for r, n in zip(rs, steps, strict=True)):.2f} |"
        )
    d = welch_diff_ci(finals["trl"], finals["ours"])
    dh = welch_diff_ci(held["trl"]["gold"], held["ours"]["gold"])
    n = min(len(runs[i][s]["gold"]) for i in runs for s in seeds)
    outside = 0
    for t in range(n):
        dt = welch_diff_ci([runs["trl"][s]["gold"][t] for s in seeds],
                           [runs["ours"][s]["gold"][t] for s in seeds])  # fmt: skip
        outside += abs(dt[0]) > dt[1]
    text = "\n".join(lines) + (
        f"\n\nTRL − ours: final training gold {pm(d)}, held-out gold {pm(dh)} (Welch 95 %); "
        f"per-step difference of the seed means outside its 95 % interval at {outside} of {n} "
        f"steps (seeds {seeds}). CPU s / step: the whole run's CPU seconds (start-up, final save "
        "included) per rollout; s / step: training wall seconds per rollout."
    )
    if fig is not None:
        _plot(runs, seeds, fig)
        text += f"\n\nFigure: {fig}"
    (root / "summary.md").write_text(text + "\n")
    return text


def _plot(runs: dict, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.analysis import mean_ci

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for impl, color in (("ours", "C0"), ("trl", "C3")):
        curves = [runs[impl][s]["gold"] for s in seeds]
        n = min(map(len, curves))
        stats = [mean_ci([c[i] for c in curves]) for i in range(n)]
        xs = range(1, n + 1)
        m = [s[0] for s in stats]
        h = [s[1] for s in stats]
        label = {"ours": "marlhf grpo", "trl": "TRL GRPOTrainer"}[impl]
        ax.plot(xs, m, color=color, label=f"{label} ({len(seeds)} seeds)")
        ax.fill_between(xs, [a - b for a, b in zip(m, h, strict=True)],
                        [a + b for a, b in zip(m, h, strict=True)], color=color, alpha=0.2)  # fmt: skip
    ax.set_xlabel("rollout (16 answers, 2 optimizer steps)", fontsize=8)
    ax.set_ylabel("gold of the rollout's answers", fontsize=8)
    ax.set_title("GRPO on verdict-64: marlhf vs TRL (mean ± 95 %)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output_dir", default="output/trl_grpo")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--steps", type=int, default=30, help="rollouts (our PPO steps)")
    ap.add_argument("--trl_python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--figure", default=None, help="PNG of the curves (default: OUTPUT_DIR)")
    ap.add_argument("--analyze_only", action="store_true")
    ap.add_argument("--_trl_worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args._trl_worker:
        trl_worker(Path(args._trl_worker), seeds[0], args.steps)
        return
    root = Path(args.output_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not args.analyze_only:
        t0 = time.time()
        execute(root, seeds, args.steps, args.trl_python)
        print(f"[trl_grpo] {time.time() - t0:.0f} s wall", flush=True)
    fig = Path(args.figure) if args.figure else root / "trl_grpo_gold.png"
    print(analyze(root, fig))


if __name__ == "__main__":
    main()
