"""The PPO vs MA-PPO experiment's pure analysis (benchmarks/ppo_vs_mappo.py), against hand-worked
numbers and plain-loop references, and the validity of the command lines it builds."""

from __future__ import annotations

import csv
import doctest
import json
import random
from pathlib import Path

import pytest

from benchmarks import ppo_vs_mappo as exp

ROOT = Path(__file__).resolve().parents[2]


def test_docstring_examples():
    result = doctest.testmod(exp)
    assert result.attempted > 0 and result.failed == 0


def test_smooth_matches_plain_loop():
    rng = random.Random(0)
    xs = [rng.uniform(-2, 2) for _ in range(37)]
    for w in (1, 2, 5, 40):
        ref = []
        for i in range(len(xs)):
            lo = max(0, i - w + 1)
            window = xs[lo : i + 1]
            ref.append(sum(window) / len(window))
        assert exp.smooth(xs, w) == pytest.approx(ref, abs=1e-12)
    assert exp.smooth([1.0, 2.0, 3.0], 1) == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        exp.smooth([1.0], 0)


def test_first_reach_and_speedup():
    assert exp.first_reach([1, 2, 3, 4], [0.0, 0.2, 0.5, 0.4], 0.5) == 3  # equality counts
    assert exp.first_reach([5, 10, 15], [0.6, 0.0, 0.0], 0.5) == 5
    assert exp.first_reach([1, 2], [0.0, 0.1], 0.5) is None
    assert exp.speedup(80, 40) == 2.0
    assert exp.speedup(80, 47) == pytest.approx(1.7021, abs=1e-4)
    assert exp.speedup(80, None) is None


def _metrics(gold: list[float]) -> dict[str, list[float]]:
    n = len(gold)
    return {
        "gold": gold,
        "score": [0.5] * n,
        "kl": [1.0] * n,
        "macro_len": [2.0] * n,
        "step_time": [0.25] * n,
    }


def _hand_runs():
    # values are multiples of 1/8, exact in binary floating point
    return {
        "ppo": {
            1: _metrics([0.0, 0.25, 0.5, 0.5, 0.75, 0.75]),
            2: _metrics([0.0, 0.25, 0.5, 0.5, 0.75, 0.75]),
        },
        "fast": {
            1: _metrics([0.0, 0.5, 0.75, 1.0, 1.0, 1.0]),
            2: _metrics([0.0, 0.25, 0.75, 0.75, 1.0, 1.0]),
        },
        "never": {1: _metrics([0.0] * 6), 2: _metrics([0.25] * 6)},
    }


def test_summarize_hand_worked_unsmoothed():
    rows = {r.arm: r for r in exp.summarize(_hand_runs(), final_window=2, smooth_window=1)}
    # PPO final gold: mean of last 2 = 0.75 in both seeds -> target 0.75
    assert rows["ppo"].gold == (0.75, 0.0)
    # fast: mean curve [0, .375, .75, .875, 1, 1] first >= .75 at step 3 -> 6 / 3 = 2x
    fast = rows["fast"]
    assert fast.reach_step == 3
    assert fast.speedup == 2.0
    assert fast.seeds_reached == 2  # each seed's own curve reaches 0.75 at step 3
    assert fast.gold == (1.0, 0.0)
    assert fast.gold_vs_ppo == (0.25, 0.0)
    assert fast.steps == 6 and fast.n_seeds == 2
    assert fast.score == (0.5, 0.0) and fast.kl == (1.0, 0.0)
    assert fast.macro_len == 2.0 and fast.step_time == 0.25
    never = rows["never"]
    assert never.reach_step is None and never.speedup is None and never.seeds_reached == 0
    # final gold 0 and 0.25: mean .125, sd sqrt(1/32), t_1 = 12.706, half = 12.706 * 0.125
    assert never.gold[0] == 0.125
    assert never.gold[1] == pytest.approx(12.706 * 0.125)


def test_summarize_hand_worked_smoothed():
    rows = {r.arm: r for r in exp.summarize(_hand_runs(), final_window=2, smooth_window=2)}
    # trailing-2 mean of [0, .375, .75, .875, 1, 1] = [0, .1875, .5625, .8125, .9375, 1]
    fast = rows["fast"]
    assert fast.reach_step == 4
    assert fast.speedup == 1.5
    # seed 1 smoothed [0, .25, .625, .875, ..] -> 4; seed 2 [0, .125, .5, .75, ..] -> 4
    assert fast.seeds_reached == 2


def test_markdown_table_cells():
    rows = exp.summarize(_hand_runs(), final_window=2, smooth_window=1)
    table = exp.markdown_table(rows).splitlines()
    assert len(table) == 2 + 3
    ppo, fast, never = table[2:]
    assert ppo.startswith("| ppo | 2 | 6 | 0.750 ± 0.000 | — |")
    # PPO's own mean curve [0, .25, .5, .5, .75, .75] reaches its final 0.75 at step 5
    assert ppo.endswith("| 5 | — | 2/2 |")
    assert "| 3 | 2.00× | 2/2 |" in fast
    assert "| not reached | — | 0/2 |" in never


def test_load_run_keeps_last_row_per_step_and_writes_csv(tmp_path):
    rows = [
        {"step": 1, "objective/gold": -1.0, "objective/score": 0.1, "objective/kl": 0.0,
         "macro/mean_len": 5.0, "time/step": 2.0},
        {"step": 2, "objective/gold": -0.5, "objective/score": 0.2, "objective/kl": 0.5,
         "macro/mean_len": 4.0, "time/step": 1.0},
        # a resumed run logs step 2 again: the last one counts
        {"step": 2, "objective/gold": -0.25, "objective/score": 0.3, "objective/kl": 0.75,
         "macro/mean_len": 4.5, "time/step": 1.5},
    ]  # fmt: skip
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = exp.load_run(f)
    assert run["gold"] == [-1.0, -0.25]
    assert run["score"] == [0.1, 0.3]
    assert run["elapsed"] == [2.0, 3.5]
    exp.write_csv({"ppo": {7: run}}, tmp_path / "c.csv")
    with open(tmp_path / "c.csv") as fh:
        got = list(csv.DictReader(fh))
    assert list(got[0]) == list(exp.CSV_COLUMNS)
    assert [(r["arm"], r["seed"], r["step"]) for r in got] == [("ppo", "7", "1"), ("ppo", "7", "2")]
    assert float(got[1]["gold"]) == -0.25 and float(got[1]["elapsed_s"]) == 3.5


def test_with_overrides():
    flags = ["--a", "1", "--b", "2"]
    assert exp.with_overrides(flags, {"--b": "3", "--c": "4"}) == [
        "--a",
        "1",
        "--b",
        "3",
        "--c",
        "4",
    ]
    assert flags == ["--a", "1", "--b", "2"]  # not modified


@pytest.mark.parametrize("size", ["cpu", "gpu"])
def test_command_lines_parse_into_valid_configs(size, tmp_path):
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.reward.config import RewardStageConfig
    from marlhf.stages.sft.config import SFTConfig

    sz = exp.SIZES[size]
    common = ["--data_output_path", str(tmp_path / "cache"), "--disable_progress_bar"]
    stages = exp.stage_args(tmp_path, sz, "tiny", common)
    sft = parse_config(SFTConfig, stages["sft"][2:])
    assert sft.log.output_dir == str(tmp_path / "sft")
    parse_config(RewardStageConfig, stages["rm"][2:])
    for arm in exp.ALL_ARMS:
        cfg = parse_config(PPOStageConfig, exp.ppo_args(tmp_path, arm, 3, sz.steps, sz, common)[2:])
        assert cfg.ppo.optim.seed == 3 and cfg.ppo.optim.max_steps == sz.steps
        # every arm shares all settings but its macro-action rule and estimator
        assert cfg.generation.per_device_generation_batch_size == int(
            sz.ppo.get("--per_device_generation_batch_size", "16")
        )
        assert cfg.models.actor.optim.learning_rate == 2e-4 and cfg.ppo.kl_ctl == 0.05
    base = parse_config(PPOStageConfig, exp.ppo_args(tmp_path, "ppo", 3, 10, sz, common)[2:])
    assert base.macro.termination_condition == "fixed" and base.macro.ngram == 1


def test_estimator_arms():
    """The critic-free arms (GRPO at the token and macro level, Monte-Carlo credit) and the
    value-function arms get the estimator, ratio level and sampling settings they name."""
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    sz = exp.SIZES["cpu"]
    common = ["--data_output_path", "cache", "--disable_progress_bar"]

    def cfg(arm):
        return parse_config(PPOStageConfig, exp.ppo_args(Path("o"), arm, 1, 5, sz, common)[2:])

    grpo, macro, mc = cfg("grpo"), cfg("grpo_macro5"), cfg("macro_mc5")
    assert (grpo.ppo.estimator, grpo.ppo.n_samples_per_prompt, grpo.ppo.ratio_level) == (
        "grpo", 4, "token",
    )  # fmt: skip
    assert (macro.ppo.ratio_level, macro.macro.ngram) == ("macro", 5)
    assert (mc.ppo.estimator, mc.macro.ngram, mc.ppo.mc_rollouts) == ("macro_mc", 5, 4)
    for vf in ("equal", "position", "unit", "start"):
        c = cfg(f"vf_{vf}5")
        assert (c.macro.value_function, c.macro.ngram, c.ppo.estimator) == (vf, 5, "gae")
    caps = {cfg(f"mc_cost{n}").ppo.mc_max_boundaries for n in (1, 3, 5, 10)}
    assert caps == {8}
    assert set(exp.ARMS) >= {"ppo", "fixed5", "grpo", "grpo_macro5", "macro_mc5"}


def test_eval_command_parses(tmp_path):
    from marlhf.cli import parse_config
    from marlhf.inference import InferenceArgs

    args = exp.eval_args(tmp_path, "vf_start5", 2, 128)
    assert args[0].endswith("inference_with_rewards.py")
    parse_config(InferenceArgs, args[1:])  # the inference program's own parser accepts them
    assert args[args.index("--temperature") + 1] == "1.0"
    assert args[args.index("--output") + 1] == str(
        exp.run_dir(tmp_path, "vf_start5", 2) / "eval.jsonl"
    )


def test_eval_and_cost_tables(tmp_path):
    rows = [
        {"response": "my dog", "gold": 1.0, "reward": 0.0},
        {"response": "so", "gold": 0.0, "reward": 2.0},
    ]
    d = exp.run_dir(tmp_path, "ppo", 1)
    d.mkdir(parents=True)
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = exp.collect_evals(tmp_path, ["ppo", "grpo"], [1, 2])
    assert evals == {"ppo": {1: {"junk": 0.5, "gold": 0.5, "rm": 1.0, "n": 2}}}
    table = exp.eval_table(evals).splitlines()
    assert table[2] == "| ppo | 1 | 0.50 | 0.50 | 0.500 | — | 1.000 |"
    nan = float("nan")
    runs = {"ppo": {1: {"step_time": [1.0, 1.0], "macro_len": [1.0, 1.0], "mc_time": [nan, nan]}}}
    assert exp.cost_table(runs).splitlines()[2] == "| ppo | 1 | 1.00 | 1.000 | — | — | — |"
