"""The README's demo command end to end (smaller step counts to bound CI time): SFT -> RM -> PPO and
MA-PPO -> inference -> report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_pipeline_end_to_end(tmp_path):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        MARLHF_HOME=str(tmp_path / "home"),
    )
    out = tmp_path / "demo"
    cmd = [
        sys.executable,
        "-m",
        "marlhf.demo",
        "--output_dir",
        str(out),
        "--ppo_steps",
        "3",
        "--eval_prompts",
        "16",
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = (out / "report.md").read_text()
    for name in (
        "| sft |",
        "| ppo |",
        "| mappo |",
        "win rate of MA-PPO",
        "held-out pairwise accuracy",
    ):
        assert name in report, report
    assert (out / "training_curves.png").stat().st_size > 1000
    # the RM stage does not depend on --ppo_steps: this is the demo's reward model. Measured
    # 2026-11-24: 0.813 against the labels of the 300 held-out comparisons (their own agreement
    # with gold: 0.881), 0.928 against the gold order; the SFT model's RM was at 0.63 / 0.62.
    rm = json.loads((out / "report.json").read_text())["reward_model"]
    assert rm["pairs"] == 300
    assert rm["accuracy_vs_labels"] >= 0.80 and rm["accuracy_vs_gold_order"] >= 0.90, rm
    # a second run resumes: every stage is skipped
    again = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count(": already done (") == 8, again.stdout
