"""benchmarks/fixed_turns.py: the environment of the multi-turn cost benchmarks."""

import time

import pytest

pytest.importorskip("skyrl_gym")

from benchmarks.fixed_turns import OBSERVATION_TEXT, FixedTurns  # noqa: E402


def test_answers_until_its_last_turn_and_rewards_that_turn_only():
    env = FixedTurns({"turns": 3})
    prompt = [{"role": "user", "content": "hi"}]
    assert env.init(prompt) == (prompt, {})
    outs = [env.step(f"call {i}") for i in range(3)]
    assert [o["done"] for o in outs] == [False, False, True]
    assert outs[0]["observations"] == [{"role": "user", "content": OBSERVATION_TEXT}]
    assert outs[2]["observations"] == []
    assert outs[0]["reward"] == outs[1]["reward"] == 0.0


def test_last_reward_is_the_crc32_parity_of_the_action():
    # zlib.crc32(b"") = 0 (even), zlib.crc32(b"a") = 0xE8B7BE43 (odd)
    assert FixedTurns({"turns": 1}).step("")["reward"] == 0.0
    assert FixedTurns({"turns": 1}).step("a")["reward"] == 1.0


def test_step_s_makes_every_step_take_that_long():
    env = FixedTurns({"turns": 2, "step_s": 0.05})
    t0 = time.perf_counter()
    env.step("x")
    env.step("y")
    assert time.perf_counter() - t0 >= 0.1
