"""benchmarks/bench_turn_step.py: the whole multi-turn PPO step against one answer with as many
action tokens, end to end on a tiny random model (mechanics only; its timings are not checked)."""

import pytest

pytest.importorskip("skyrl_gym")

from benchmarks import bench_turn_step as bench  # noqa: E402


def test_fixed_turns_env_answers_until_its_last_turn():
    env = bench.FixedTurns({"turns": 3})
    assert env.init([{"role": "user", "content": "hi"}]) == (
        [{"role": "user", "content": "hi"}],
        {},
    )
    outs = [env.step(f"call {i}") for i in range(3)]
    assert [o["done"] for o in outs] == [False, False, True]
    assert outs[0]["observations"] == [{"role": "user", "content": bench.OBSERVATION}]
    assert outs[2]["observations"] == [] and outs[2]["reward"] in (0.0, 1.0)
    assert outs[0]["reward"] == outs[1]["reward"] == 0.0


@pytest.mark.slow
def test_both_arms_train_on_as_many_action_tokens(tmp_path):
    argv = ["--turns", "2", "--action_tokens", "2", "--batch", "4", "--steps", "2", "--rounds", "1",
            "--work_dir", str(tmp_path)]  # fmt: skip
    out = bench.main(argv)
    (turns,), (single,) = out["k2"]["runs"]["turns"], out["k2"]["runs"]["single"]
    # a random model runs every action to its budget: 2 turns of 2 tokens, one turn of 4
    assert turns["turns"] == 2.0 and single["turns"] == 1.0
    assert turns["action_tokens"] == single["action_tokens"] == 4.0
    ratio = out["k2"]["turns_over_single"]["step"]
    assert ratio["median"] == pytest.approx(turns["step"] / single["step"])
    assert set(out["k2"]["turns_over_single"]) == set(bench.PHASES)
