"""The cost of a whole multi-turn PPO step against a single-turn one with as many action tokens: the
stage itself (``python -m marlhf.stages.ppo --env``), its rollout, scoring and update, one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_turn_step.py               # static decoder
    OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
        .venv-vllm/bin/python benchmarks/bench_turn_step.py --backend vllm        # vLLM

``benchmarks/bench_multiturn.py`` measures the sampling alone; this one measures what a training
step costs. Both arms play ``benchmarks/fixed_turns.py:FixedTurns``: an environment that answers
every action with one fixed observation (the trail task's ``my boss: call my cousin.``, about 10
tokens with the chat template's turn markers and the next generation prompt) and ends the episode
after ``turns`` turns, with a reward of 0 or 1 from the last action's text (so that the advantages
are not all 0):

- ``turns``: k turns of ``--action_tokens`` m tokens each (``--max_answer_seq_len m``), the
  observation after each but the last;
- ``single``: one turn of k × m tokens (``--max_answer_seq_len k*m``, ``turns`` 1): one answer with
  as many action tokens and no observation.

The policy and critic are a random-initialised model of ``tiny-base-trail``'s shape with its
tokenizer and chat template (made in the work directory), so nearly every action runs to its
token budget (an EOS has about a 1/958 chance a token); the mean action tokens of each arm are
printed beside the times. Every other flag is shared: ``--batch`` episodes a step (the trail
task's prompts), one PPO epoch in minibatches of 8 (or the batch), turn-level macro actions
(``--termination_condition turn``: for the single arm, one macro action), ``--env_timeout_s 0``
(the environments in the trainer's process: the environment costs nothing here).

Each (k, arm) runs ``--steps`` steps as a subprocess, ``--rounds`` times, the two arms of a k one
after the other in an order that alternates between rounds, so that a drift of a shared machine's
speed falls on both. A run's figure is the median over steps 2.. of its ``time/step`` and its
phases (``time/generate``, ``time/score``, ``time/train``: the stage's own metrics); the ratio
``turns / single`` is taken per round from the two adjacent runs and printed as the median over
rounds with their range. The goal stated for users: turns cost at most 10 % more. The last line is
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("step", "generate", "score", "train")


def make_policy(work: Path) -> Path:
    """A random-initialised model of ``tiny-base-trail``'s shape (seed 0) with its tokenizer and
    chat template, saved under ``work``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from marlhf.models.load import resolve_model_path

    base = Path(resolve_model_path("tiny-base-trail"))
    out = work / "policy"
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.safetensors", "*.json.lock"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
    model.save_pretrained(out)
    return out


def stage_command(policy: Path, run: Path, args, turns: int, answer: int) -> list[str]:
    """One arm's stage-3 command: ``turns`` turns of at most ``answer`` tokens each."""
    total = 64 + turns * (answer + 16)  # prompt, then per turn the action and the observation
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo",
        "--actor_model_name_or_path", str(policy), "--critic_model_name_or_path", str(policy),
        "--env", f"{ROOT / 'benchmarks' / 'fixed_turns.py'}:FixedTurns",
        "--env_config", json.dumps({"turns": turns}), "--max_turns", str(turns),
        "--env_timeout_s", "0", "--data_path", f"marlhf-trail-4:{args.batch * args.steps}",
        "--termination_condition", "turn",
        "--max_answer_seq_len", str(answer), "--max_total_seq_len", str(total),
        "--max_prompt_seq_len", str(total if args.backend == "vllm" else 64),
        "--generation_backend", args.backend,
        "--temperature", "1.0", "--top_k", "0",
        "--max_steps", str(args.steps), "--num_train_epochs", "100",
        "--per_device_generation_batch_size", str(args.batch),
        "--per_device_training_batch_size", str(min(8, args.batch)), "--ppo_epochs", "1",
        "--seed", "1", "--disable_progress_bar", "--output_dir", str(run),
    ]  # fmt: skip
    return cmd


def run_arm(policy: Path, run: Path, args, turns: int, answer: int) -> dict:
    """Run one arm; the medians over steps 2.. of its phases' seconds and its action tokens."""
    from marlhf.runtime.tracking import read_metrics

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.setdefault("OMP_NUM_THREADS", "1")
    log = run.with_suffix(".log")
    with open(log, "w") as f:
        proc = subprocess.run(
            stage_command(policy, run, args, turns, answer),
            stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        )  # fmt: skip
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"error: the stage failed in {run} (log {log}): {tail[0]}")
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "time/step" in r][1:]
    if not rows:
        raise SystemExit(f"error: {run} logged fewer than 2 steps; pass --steps 2 or more")
    out = {p: statistics.median(r[f"time/{p}"] for r in rows) for p in PHASES}
    out["action_tokens"] = statistics.fmean(r["response/length"] for r in rows)
    out["turns"] = statistics.fmean(r.get("env/turns", 1.0) for r in rows)
    return out


def ratio_summary(values: list[float]) -> dict:
    """Median and range of per-round ratios."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8], help="k of the turns arm")
    p.add_argument("--action_tokens", type=int, default=6, help="m: action tokens a turn")
    p.add_argument("--batch", type=int, default=16, help="episodes a step")
    p.add_argument("--steps", type=int, default=6, help="steps a run (the first is not counted)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", default="static", choices=("static", "vllm"))
    p.add_argument("--work_dir", type=Path, default=None, help="default: a temporary directory")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps: at least 2 (the first step is not counted)")
    # absolute: the stages run in the repository root
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="bench-turn-step-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    policy = make_policy(work)
    m = args.action_tokens
    results: dict = {"backend": args.backend, "batch": args.batch, "steps": args.steps,
                     "action_tokens": m, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip
    for k in args.turns:
        runs: dict[str, list[dict]] = {"turns": [], "single": []}
        for r in range(args.rounds):
            order = ("turns", "single") if r % 2 == 0 else ("single", "turns")
            for arm in order:
                turns, answer = (k, m) if arm == "turns" else (1, k * m)
                run = work / f"k{k}_{arm}_r{r}"
                runs[arm].append(run_arm(policy, run, args, turns, answer))
                print(f"[bench_turn_step] k={k} {arm} round {r}: {runs[arm][-1]}", flush=True)
        ratios = {
            ph: ratio_summary([t[ph] / s[ph] for t, s in zip(runs["turns"], runs["single"], strict=True)])
            for ph in PHASES
        }  # fmt: skip
        results[f"k{k}"] = {"runs": runs, "turns_over_single": ratios}
        med = {arm: {ph: statistics.median(x[ph] for x in rs) for ph in (*PHASES, "action_tokens")}
               for arm, rs in runs.items()}  # fmt: skip
        print(
            f"{args.backend} k={k}: s/step turns {med['turns']['step']:.3f} single "
            f"{med['single']['step']:.3f} (action tokens {med['turns']['action_tokens']:.1f} / "
            f"{med['single']['action_tokens']:.1f}); turns / single: "
            + ", ".join(
                f"{ph} {ratios[ph]['median']:.2f} [{ratios[ph]['min']:.2f}, {ratios[ph]['max']:.2f}]"
                for ph in PHASES
            ),
            flush=True,
        )
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
