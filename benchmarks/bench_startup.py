"""Start-up of the stages on the tiny models, by phase: where the seconds before the first step go.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_startup.py            # ~1-2 min idle

Runs SFT (``tiny-base``), the reward model (``tiny-rm-base``) and PPO (the two outputs) for one step
each as plain ``python -m marlhf.stages...`` processes on the bundled data, ``--repeats`` times (the
first run builds the tokenised-data cache; later runs read it), and prints, per stage and run, the
phases each stage logs (``marlhf.runtime.startup``: imports, distributed, data, model, engine, first
step) in wall and CPU seconds, and the process's whole wall and CPU time (``getrusage`` of the
child). CPU seconds barely move with the machine's load; wall seconds do: quote the load (printed
first, the 1-minute load average) with them. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_LINE = re.compile(r"start-up ([\d.]+) s wall, ([\d.]+) s CPU: (.*) \(wall/CPU s\)")


def _env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false",
    )  # fmt: skip
    return env


def parse_line(text: str) -> dict[str, tuple[float, float]]:
    """``{phase: (wall, cpu)}`` of the start-up line in ``text`` (empty if none).

    >>> parse_line("x start-up 2.0 s wall, 1.5 s CPU: imports 1.2/1.0, data 0.8/0.5 (wall/CPU s)")
    {'imports': (1.2, 1.0), 'data': (0.8, 0.5)}
    """
    m = _LINE.search(text)
    if m is None:
        return {}
    out = {}
    for part in m.group(3).split(", "):
        name, _, nums = part.rpartition(" ")
        wall, cpu = nums.split("/")
        out[name] = (float(wall), float(cpu))
    return out


def run(cmd: list[str]) -> dict:
    """Run one stage; its phases, whole wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[2:4])} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"phases": parse_line(proc.stderr), "wall": wall, "cpu": cpu}


def commands(root: Path, data_cache: Path, i: int) -> dict[str, list[str]]:
    common = [
        "--data_output_path", str(data_cache), "--disable_progress_bar", "--max_steps", "1",
        "--resume", "never",
    ]  # fmt: skip
    py = [sys.executable, "-m"]
    sft, rm, ppo = (root / f"{s}{i}" for s in ("sft", "rm", "ppo"))
    return {
        "sft": [*py, "marlhf.stages.sft", "--model_name_or_path", "tiny-base",
                "--max_seq_len", "192", "--output_dir", str(sft), *common],
        "rm": [*py, "marlhf.stages.reward", "--model_name_or_path", "tiny-rm-base",
               "--max_seq_len", "192", "--output_dir", str(rm), *common],
        "ppo": [*py, "marlhf.stages.ppo", "--actor_model_name_or_path", str(sft),
                "--critic_model_name_or_path", str(rm), "--max_answer_seq_len", "32",
                "--per_device_generation_batch_size", "8", "--per_device_training_batch_size", "8",
                "--output_dir", str(ppo), *common],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="runs of each stage (first: cold cache)")
    ap.add_argument("--stages", default="sft,rm,ppo", help="comma-separated subset")
    args = ap.parse_args(argv)
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="marlhf-startup-") as tmp:
        root = Path(tmp)
        for i in range(args.repeats):
            cmds = commands(root, root / "data_cache", i)
            for stage in args.stages.split(","):
                results.setdefault(stage, []).append(run(cmds[stage]))
    for stage, runs in results.items():
        for i, r in enumerate(runs):
            label = f"{stage} run {i + 1}" + (" (cold data cache)" if i == 0 else "")
            print(f"\n{label}: process {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU")
            for name, (w, c) in r["phases"].items():
                print(f"  {name:<18} {w:6.2f} s wall {c:6.2f} s CPU")
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.1f}")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
