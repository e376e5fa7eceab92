"""benchmarks/bench_turn_step.py: the whole multi-turn PPO step against one answer with as many
action tokens, end to end on a tiny random model (mechanics only; its timings are not checked)."""

import statistics

import pytest

pytest.importorskip("skyrl_gym")

from benchmarks import bench_turn_step as bench  # noqa: E402
from marlhf.runtime.tracking import read_metrics  # noqa: E402


@pytest.mark.slow
def test_both_arms_train_on_as_many_action_tokens(tmp_path):
    argv = ["--turns", "2", "--action_tokens", "2", "--batch", "4", "--steps", "2", "--rounds", "1",
            "--work_dir", str(tmp_path)]  # fmt: skip
    out = bench.main(argv)
    (turns,), (single,) = out["k2"]["runs"]["turns"], out["k2"]["runs"]["single"]
    # a random model runs every action to its budget: 2 turns of 2 tokens, one turn of 4
    assert turns["turns"] == 2.0 and single["turns"] == 1.0
    assert turns["action_tokens"] == single["action_tokens"] == 4.0

    # the ratio from the stage's own per-step log: steps 2.. of each run, their median
    def median_step(run):
        rows = read_metrics(tmp_path / run / "metrics.jsonl")
        return statistics.median([r["time/step"] for r in rows if "time/step" in r][1:])

    ratio = out["k2"]["turns_over_single"]["step"]
    assert ratio["median"] == pytest.approx(
        median_step("k2_turns_r0") / median_step("k2_single_r0")
    )
    assert set(out["k2"]["turns_over_single"]) == set(bench.PHASES)
