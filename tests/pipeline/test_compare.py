"""marlhf compare (marlhf/pipeline/compare.py) on runs with hand-made metrics: pooled seeds, final
values against hand-worked t and Welch intervals, steps to a target, paired result files."""

from __future__ import annotations

import doctest
import json
import math
import statistics

import pytest

import marlhf.pipeline.compare as compare_mod
from marlhf.cli import config_to_dict
from marlhf.commands import main as marlhf
from marlhf.macro.config import MacroConfig
from marlhf.pipeline.compare import CompareConfig, arms_of, compare, final_values, reach
from marlhf.stages.ppo.config import PPOStageConfig
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


# ---------------------------------------------------------------- inputs that are not clean


def test_non_finite_values_in_seeds_are_warned_and_left_out(runs, tmp_path, capsys):
    """An arm of two seeds with a NaN and an inf: the report is written from the finite values."""
    with open(runs / "ppo_s1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "time": 0.0, "objective/gold": NaN, "objective/kl": Infinity}\n')
    out = tmp_path / "nan"
    assert marlhf(["compare", str(runs / "ppo_s*"), "--label", "PPO", "--output", str(out),
                   "--final_window", "2"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    f = runs / "ppo_s1" / "metrics.jsonl"
    assert f"warning: {f} line 5: objective/gold non-finite (NaN, inf or null); left out" in err
    assert f"{f} line 5: objective/kl non-finite" in err
    report = (out / "report.md").read_text()
    half = 12.706 * statistics.stdev([1.0, 1.2]) / math.sqrt(2)  # the finite finals 1.0, 1.2
    assert f"| PPO | 2 | 1.100 ± {half:.3f}" in report
    assert "## Warnings" in report and "line 5: objective/gold non-finite" in report


def test_a_run_still_going_is_compared_on_its_complete_rows(runs, tmp_path, capsys):
    with open(runs / "mappo_s1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "time": 0.0, "objective/gold": 1.')  # half-written
    out = tmp_path / "going"
    assert marlhf(["compare", str(runs / "ppo_s*"), str(runs / "mappo_s*"), "--label", "PPO",
                   "--label", "MA-PPO", "--output", str(out)]) == 0  # fmt: skip
    assert "line 5: a half-written last line (a run still going?)" in capsys.readouterr().err
    assert "| MA-PPO | 3 |" in (out / "report.md").read_text()


def test_a_directory_given_twice_is_one_seed(runs):
    arms = arms_of([str(runs / "ppo_s1"), str(runs / "ppo_s1")], ["PPO", "PPO"])
    assert len(arms["PPO"]) == 1


def test_shell_expanded_globs_with_one_label_per_arm(runs, tmp_path):
    """`marlhf compare out/ppo_s* out/mappo_s* --label PPO --label "MA-PPO n=5"` as pasted: the
    shell hands over five directories; the runs' run_config.json make two arms."""
    for path in sorted(runs.glob("*_s*")):
        cfg = PPOStageConfig(macro=MacroConfig(ngram=5 if path.name.startswith("mappo") else 1))
        cfg.ppo.optim.seed = int(path.name[-1])
        (path / "run_config.json").write_text(json.dumps(config_to_dict(cfg)))
    expanded = [str(p) for p in sorted(runs.glob("ppo_s*")) + sorted(runs.glob("mappo_s*"))]
    out = tmp_path / "pasted"
    assert marlhf(["compare", *expanded, "--label", "PPO", "--label", "MA-PPO n=5",
                   "--output", str(out)]) == 0  # fmt: skip
    report = (out / "report.md").read_text()
    assert "| PPO | 2 |" in report and "| MA-PPO n=5 | 3 |" in report
    assert "## Warnings" not in report


def _stage_run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_and_rm_runs_compare_their_losses(tmp_path):
    # SFT: train/loss every step, eval/loss and eval/ppl at steps 2 and 4
    for name, shift in (("sft_a", 0.0), ("sft_b", 0.5)):
        rows = [{"step": s, "time": 0.0, "train/loss": 3.0 - 0.5 * s + shift} for s in (1, 2, 3, 4)]
        rows += [{"step": s, "time": 0.0, "eval/loss": 2.0 - 0.25 * s + shift,
                  "eval/ppl": 7.0 - s} for s in (2, 4)]  # fmt: skip
        _stage_run(tmp_path / name, rows)
    out = tmp_path / "sft_cmp"
    report = compare(
        [str(tmp_path / "sft_a"), str(tmp_path / "sft_b")],
        CompareConfig(output=str(out), final_window=2),
    ).read_text()
    for stem in ("train_loss", "eval_loss", "eval_ppl"):
        assert (out / f"{stem}.png").stat().st_size > 1000
    # finals: train/loss mean of steps 3, 4 = (1.5 + 1.0) / 2; eval/loss of steps 2, 4 = 1.25
    assert "| arm | seeds | training loss | held-out loss | held-out perplexity |" in report
    assert "| sft_a | 1 | 1.250 | 1.250 | 4.000 |" in report
    assert "| sft_b | 0.500 | 0.500 | 0.000 |" in report  # the difference to sft_a
    assert "| |" not in report and "|  |" not in report  # no unnamed column
    # a reward model: accuracy
    _stage_run(tmp_path / "rm", [{"step": s, "time": 0.0, "train/loss": 0.7, "eval/accuracy": 0.5 + 0.1 * s}
                                 for s in (1, 2)])  # fmt: skip
    report = compare([str(tmp_path / "rm")], CompareConfig(output=str(tmp_path / "rm_cmp"),
                                                          final_window=1)).read_text()  # fmt: skip
    assert "held-out accuracy" in report and "| rm | 1 | 0.700 | 0.700 |" in report


def test_runs_without_a_reported_metric_are_refused(tmp_path, capsys):
    _stage_run(tmp_path / "odd", [{"step": 1, "time": 0.0, "something/else": 1.0}])
    out = tmp_path / "odd_cmp"
    assert marlhf(["compare", str(tmp_path / "odd"), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no run logs a metric marlhf compare reports" in err
    assert "Traceback" not in err and not (out / "report.md").exists()
