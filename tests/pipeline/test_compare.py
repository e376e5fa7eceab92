"""marlhf compare (marlhf/pipeline/compare.py) on runs with hand-made metrics: pooled seeds, final
values against hand-worked t and Welch intervals, steps to a target, paired result files."""

from __future__ import annotations

import doctest
import json
import math
import statistics

import pytest

import marlhf.pipeline.compare as compare_mod
from marlhf.commands import main as marlhf
from marlhf.pipeline.compare import CompareConfig, arms_of, compare, final_values, reach
from marlhf.stats import t975


def _run(path, golds, score=0.0):
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as f:
        for step, g in enumerate(golds, start=1):
            row = {"step": step, "time": 0.0, "objective/gold": g, "objective/score": score + g,
                   "objective/kl": 0.01 * step, "macro/mean_len": 5.0}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
def runs(tmp_path):
    # arm A (two seeds) rises to 1.0 and 1.2; arm B (three seeds) is faster
    _run(tmp_path / "ppo_s1", [0.0, 0.5, 1.0, 1.0])
    _run(tmp_path / "ppo_s2", [0.0, 0.6, 1.2, 1.2])
    _run(tmp_path / "mappo_s1", [0.0, 1.2, 1.4, 1.4])
    _run(tmp_path / "mappo_s2", [0.2, 1.3, 1.5, 1.5])
    _run(tmp_path / "mappo_s3", [0.1, 1.1, 1.6, 1.6])
    return tmp_path


def test_doctests():
    assert doctest.testmod(compare_mod).failed == 0


def test_seeds_pooled_and_final_values_by_hand(runs):
    arms = arms_of([str(runs / "ppo_s*"), str(runs / "mappo_s*")], ["PPO", "MA-PPO"])
    assert [len(v) for v in arms.values()] == [2, 3]
    assert final_values(arms["PPO"], "objective/gold", 2) == [1.0, 1.2]
    # the report's cells: mean ± t(1) * sd / sqrt(2) = 1.1 ± 12.706 * 0.1414 / 1.414
    report = compare(
        [str(runs / "ppo_s*"), str(runs / "mappo_s*")],
        CompareConfig(label=("PPO", "MA-PPO"), output=str(runs / "out"), final_window=2),
    ).read_text()
    half = 12.706 * statistics.stdev([1.0, 1.2]) / math.sqrt(2)
    assert f"| PPO | 2 | 1.100 ± {half:.3f}" in report
    # Welch: MA-PPO finals 1.4, 1.5, 1.6 against 1.0, 1.2
    a, b = [1.4, 1.5, 1.6], [1.0, 1.2]
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 2
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 1)
    want = t975(df) * math.sqrt(va + vb)
    assert f"| MA-PPO | 0.400 ± {want:.3f}" in report
    for stem in ("gold", "reward", "kl", "macro_len"):
        assert (runs / "out" / f"{stem}.png").stat().st_size > 1000
    assert "entropy.png" not in report  # no run logs it


def test_steps_to_reach(runs):
    arms = arms_of([str(runs / "ppo_s*"), str(runs / "mappo_s*")], ["PPO", "MA-PPO"])
    # target 1.1: the MA-PPO mean curve (0.1, 1.2, 1.5, 1.5) gets there at step 2; PPO at step 3
    r = reach(arms["MA-PPO"], "objective/gold", 1.1, window=1, n_boot=200)
    assert (r.step, r.reached) == (2, 1.0) and r.low == r.high == 2
    r = reach(arms["PPO"], "objective/gold", 1.1, window=1, n_boot=200)
    assert r.step == 3 and 0 < r.reached < 1  # a resample of seed 1 twice never gets there


def test_paired_results_by_hand(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows_a = [{"prompt_id": f"p{i}", "reward": 0.0, "gold": 0.5} for i in range(4)]
    rows_b = [{"prompt_id": f"p{i}", "reward": r, "gold": 0.5} for i, r in enumerate((1, 1, -1, 0))]
    a.write_text("".join(json.dumps(r) + "\n" for r in rows_a))
    b.write_text("".join(json.dumps(r) + "\n" for r in rows_b))
    report = compare([], CompareConfig(results=(str(a), str(b)), output=str(tmp_path / "o")))
    text = report.read_text()
    # RM: differences 1, 1, -1, 0: mean 0.25; wins 2, loss 1, tie 1 -> (2 + 0.5) / 4
    assert "| RM score | +0.2500 |" in text and "| 4 | 0.625 |" in text
    assert "| gold | +0.0000 |" in text and "| 4 | 0.500 |" in text


def test_command_line_and_errors(runs, tmp_path, capsys):
    out = tmp_path / "cli"
    assert marlhf(["compare", str(runs / "ppo_s*"), "--output", str(out)]) == 0
    assert (out / "report.md").exists()
    assert marlhf(["compare", str(runs / "nothing*"), "--output", str(out)]) == 2
    assert "no run directory" in capsys.readouterr().err
    two = ["--label", "a", "--label", "b", "--output", str(out)]
    assert marlhf(["compare", str(runs / "ppo_s1"), *two]) == 2  # two labels, one run
    assert marlhf(["compare", str(runs / "ppo_s1"), str(runs / "mappo_s1"), *two]) == 0
    assert "- **a**:" in (out / "report.md").read_text()
