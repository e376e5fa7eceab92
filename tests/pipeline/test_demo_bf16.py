"""The demo pipeline with every stage in bf16 lands near the same pipeline in fp32, both run here.

The command is the demo's (``python -m marlhf.demo --dtype bf16|fp32``; ZeRO-0, the demo's stage)
on its TL;DR-like task (``--task synthetic-tldr``: short answers, the cheaper check of the same
stages), with 10 PPO steps per arm and 100 held-out prompts, and two sizes cut by
:mod:`tests.support.short_demo` so that bf16 matmuls, which this CPU runs about 9x slower than
fp32's, fit the test suite: the reward model trains 30 steps and 128 train prompts are labelled.
Each figure of the bf16 run is held to the fp32 run's: no NaN anywhere in training, every stage's
recorded dtype, the reward model's accuracies and correlation, and the gold means.

Measured on CPU (2026-12-06, this command with ``--dtype fp32`` and ``--dtype bf16``, 161 s and
677 s wall beside two single-thread experiments):

=================================  =======  =======  =====
figure                             fp32     bf16     |Δ|
=================================  =======  =======  =====
RM accuracy vs held-out labels     0.803    0.797    0.007
RM accuracy vs the gold order      0.898    0.884    0.014
Pearson r (RM score, gold), SFT    0.723    0.766    0.043
gold mean, SFT                     −0.611   −0.551   0.059
gold mean, PPO (n=1)               −0.506   −0.406   0.099
gold mean, MA-PPO (n=5)            −0.501   −0.666   0.165
gold mean of the three             −0.539   −0.541   0.002
=================================  =======  =======  =====

The tolerances come from the noise of two runs that sample differently, not from one measured gap.
A gold mean over 100 prompts has a standard error of about 0.085 (gold's SD is 0.85), so two runs'
means differ by up to 0.36 at three standard errors of their difference even with no dtype effect
at all (and on this task PPO's ten steps go either way with the sampled answers); the mean of the
three policies' means, 0.2. The RM's accuracies over the same 300 held-out pairs: 0.05; its
correlation with gold, which moved most: 0.08. A bf16 run that breaks (a place that should stay
float32 and rounds instead, a loss that overflows) moves these far more, or leaves a NaN in the
training metrics, which is checked on every step."""

import json
import math
import sys
from pathlib import Path

import pytest

from tests.support.progress import run_while_progressing
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]
STALL_S = 900  # as the demo test: a stage logs every step; 15 min of silence is a hung run
RM_KEYS = ("accuracy_vs_labels", "accuracy_vs_gold_order", "pearson_rm_gold_sft")
POLICIES = ("sft", "ppo", "mappo")


def short_demo(out: Path, dtype: str, home: Path) -> dict:
    cmd = [sys.executable, "-m", "tests.support.short_demo", "--rm_steps", "30",
           "--label_prompts", "128", "--output_dir", str(out), "--dtype", dtype,
           "--task", "synthetic-tldr", "--ppo_steps", "10", "--eval_prompts", "100"]  # fmt: skip
    proc = run_while_progressing(cmd, stall_s=STALL_S, watch=out, env=stage_env(home), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for stage in ("sft", "rm", "ppo", "mappo"):
        run = json.loads((out / stage / "run_config.json").read_text())
        got = run["models"]["shared"]["dtype"] if "models" in run else run["model"]["dtype"]
        assert got == dtype, (stage, got)
    for arm in ("ppo", "mappo"):  # no NaN anywhere in training
        for line in (out / arm / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            bad = {k: v for k, v in row.items() if not math.isfinite(float(v))}
            assert not bad, (dtype, arm, row["step"], bad)
    rm_steps = [json.loads(line)["step"] for line in (out / "rm" / "metrics.jsonl").open()]
    assert max(rm_steps) == 30, max(rm_steps)  # the cut reached the stage
    return json.loads((out / "report.json").read_text())


# What the reward model from tiny-rm-base reaches in 30 steps in either dtype (measured 0.797-0.803,
# 0.884-0.898 and 0.723-0.766 above): the quality of the shipped RM base, with room for the rounding.
RM_FLOORS = {
    "accuracy_vs_labels": 0.75,
    "accuracy_vs_gold_order": 0.85,
    "pearson_rm_gold_sft": 0.65,
}


def differences(fp32: dict, bf16: dict) -> list[str]:
    """What of the bf16 report is not near the fp32 report (the tolerances of the docstring)."""
    out = []
    for key, tol in zip(RM_KEYS, (0.05, 0.05, 0.08), strict=True):
        want, got = fp32["reward_model"][key], bf16["reward_model"][key]
        if abs(got - want) > tol:
            out.append(f"{key}: fp32 {want:.3f}, bf16 {got:.3f} (tolerance {tol})")
    for dtype, report in (("fp32", fp32), ("bf16", bf16)):
        for key, floor in RM_FLOORS.items():
            if report["reward_model"][key] < floor:
                out.append(f"{key} of {dtype}: {report['reward_model'][key]:.3f} < {floor}")
    gold = {
        d: [r["policies"][p]["gold"][0] for p in POLICIES]
        for d, r in (("fp32", fp32), ("bf16", bf16))
    }
    for p, want, got in zip(POLICIES, gold["fp32"], gold["bf16"], strict=True):
        if abs(got - want) > 0.36:
            out.append(f"gold mean of {p}: fp32 {want:+.3f}, bf16 {got:+.3f} (tolerance 0.36)")
    want, got = (sum(g) / len(g) for g in (gold["fp32"], gold["bf16"]))
    if abs(got - want) > 0.2:
        out.append(f"gold mean of the three: fp32 {want:+.3f}, bf16 {got:+.3f} (tolerance 0.2)")
    return out


def _report(rm: tuple[float, float, float], gold: tuple[float, float, float]) -> dict:
    return {
        "reward_model": dict(zip(RM_KEYS, rm, strict=True)),
        "policies": {p: {"gold": [g, 0.85]} for p, g in zip(POLICIES, gold, strict=True)},
    }


def test_the_tolerances_pass_the_measured_runs_and_catch_a_broken_one():
    fp32 = _report((0.803, 0.898, 0.723), (-0.611, -0.506, -0.501))
    assert differences(fp32, _report((0.797, 0.884, 0.766), (-0.551, -0.406, -0.666))) == []
    broken = differences(fp32, _report((0.70, 0.884, 0.766), (-0.551, -0.406, -1.4)))
    assert [d.split(":")[0] for d in broken] == [
        "accuracy_vs_labels", "accuracy_vs_labels of bf16", "gold mean of mappo",
        "gold mean of the three",
    ]  # fmt: skip


@pytest.mark.slow
def test_demo_in_bf16_lands_near_fp32(tmp_path):
    fp32 = short_demo(tmp_path / "fp32", "fp32", tmp_path / "home")
    bf16 = short_demo(tmp_path / "bf16", "bf16", tmp_path / "home")
    assert differences(fp32, bf16) == []
