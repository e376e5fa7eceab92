"""The demo pipeline with every stage in bf16 (``python -m marlhf.demo --dtype bf16``; ZeRO-0, the
demo's stage) on its TL;DR-like task (``--task synthetic-tldr``: the short task, the cheaper check of
the same stages), shortened to 10 PPO steps per arm and 100 held-out prompts: it trains without NaN
and lands near the fp32 run of the same command.

Measured on CPU (2026-11-26, this command with ``--dtype fp32`` and ``--dtype bf16``):

=================================  =======  =======  =====
figure                             fp32     bf16     |Δ|
=================================  =======  =======  =====
RM accuracy vs held-out labels     0.813    0.817    0.003
RM accuracy vs the gold order      0.904    0.925    0.020
Pearson r (RM score, gold), SFT    0.812    0.805    0.007
gold mean, SFT                     −0.611   −0.585   0.026
gold mean, PPO (n=1)               −0.538   −0.532   0.006
gold mean, MA-PPO (n=5)            −0.587   −0.531   0.056
=================================  =======  =======  =====

The tolerances are about 2.5× the measured differences: 0.03 on the RM's accuracies and r (a
300-pair accuracy moves by 0.0033 per pair), 0.15 on the gold means (their own 95 % intervals over
100 prompts are ±0.17 wide, so a bf16 run is held to within one interval of fp32's)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]
FP32 = {
    "accuracy_vs_labels": 0.813,
    "accuracy_vs_gold_order": 0.904,
    "pearson_rm_gold_sft": 0.812,
    "gold": {"sft": -0.611, "ppo": -0.538, "mappo": -0.587},
}


@pytest.mark.slow
def test_demo_in_bf16_lands_near_fp32(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "marlhf.demo", "--output_dir", str(out), "--dtype", "bf16",
           "--task", "synthetic-tldr", "--ppo_steps", "10", "--eval_prompts", "100"]  # fmt: skip
    proc = subprocess.run(
        cmd, env=stage_env(tmp_path / "home"), cwd=ROOT, capture_output=True, text=True,
        timeout=2400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for stage in ("sft", "rm", "ppo", "mappo"):
        run = json.loads((out / stage / "run_config.json").read_text())
        dtype = run["models"]["shared"]["dtype"] if "models" in run else run["model"]["dtype"]
        assert dtype == "bf16", stage
    for arm in ("ppo", "mappo"):  # no NaN anywhere in training
        for line in (out / arm / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            bad = {k: v for k, v in row.items() if not math.isfinite(float(v))}
            assert not bad, (arm, row["step"], bad)
    report = json.loads((out / "report.json").read_text())
    rm = report["reward_model"]
    for key in ("accuracy_vs_labels", "accuracy_vs_gold_order", "pearson_rm_gold_sft"):
        assert rm[key] == pytest.approx(FP32[key], abs=0.03), (key, rm[key])
    for policy, gold in FP32["gold"].items():
        got = report["policies"][policy]["gold"][0]
        assert got == pytest.approx(gold, abs=0.15), (policy, got)
