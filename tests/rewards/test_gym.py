"""Tests for marlhf.rewards.gym (``--reward_source reasoning-gym``): the task's own scorer of the
entry a prompt names."""

import doctest

import pytest

import marlhf.rewards.gym as gym
from marlhf.rewards.gym import GymScore, gym_score, response_answer
from marlhf.rewards.terms import RewardBatch, RewardError


def test_doctests():
    assert doctest.testmod(gym).failed == 0


def _meta(task, index, seed=5, size=8):
    return {gym.GYM_KEY: {"task": task, "seed": seed, "size": size, "index": index}}


def test_the_entrys_own_answer_scores_1_and_another_0():
    import reasoning_gym

    # independent: the entries straight from reasoning-gym
    entries = list(reasoning_gym.create_dataset("basic_arithmetic", size=8, seed=5))
    for i, e in enumerate(entries):
        assert gym_score(_meta("basic_arithmetic", i), f" {e['answer']}\n") == 1.0
        assert gym_score(_meta("basic_arithmetic", i), f"<answer>{e['answer']}</answer>") == 1.0
        wrong = str(int(e["answer"]) + 1)
        assert gym_score(_meta("basic_arithmetic", i), wrong) == 0.0


def test_the_last_answer_tag_wins():
    assert response_answer("<answer>1</answer> no, <answer> 2 </answer>") == "2"


def test_a_prompt_of_other_data_is_named():
    import reasoning_gym

    e = reasoning_gym.create_dataset("leg_counting", size=2, seed=0)[1]
    batch = RewardBatch(["p", "not gym"], [e["answer"], "x"], [_meta("leg_counting", 1, 0, 2), {}])
    with pytest.raises(RewardError, match="row 1 of the batch .*not a reasoning-gym prompt"):
        GymScore()(batch)
    (term,) = GymScore("zero")(batch)
    assert term.values.tolist() == [1.0, 0.0] and term.errors == 1
