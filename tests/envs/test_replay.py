"""Replaying an episode's beginning (marlhf.envs.replay): the first difference between the recorded
episode and its replay, in init's messages or a replayed turn's observations, reward or done, or a
replay that stopped or failed early; the error line names the environment, the row and the turn."""

from __future__ import annotations

import doctest

import pytest

from marlhf.envs import replay
from marlhf.envs.replay import ReplayError, check_replay, replay_mismatch
from marlhf.envs.runner import EnvError, Episode, Turn

HI = [{"role": "user", "content": "hi"}]


def _turn(obs: str, reward: float | None = 0.5, done: bool = False) -> Turn:
    return Turn("go", [{"role": "user", "content": obs}], reward, done)


RECORDED = Episode(0, HI, [_turn("a"), _turn("b", 1.0), _turn("c", None, True)], stop="done")


def test_doctests():
    assert doctest.testmod(replay).failed == 0


@pytest.mark.parametrize(
    "replayed, turns, want",
    [
        (Episode(0, HI, [_turn("a"), _turn("b", 1.0), _turn("x")]), 2, None),  # the rest is new
        (Episode(0, HI, []), 0, None),
        (Episode(0, [{"role": "user", "content": "ho"}], [_turn("a")]), 1, 0),
        (Episode(0, HI, [_turn("a"), _turn("B", 1.0)]), 2, 2),
        (Episode(0, HI, [_turn("a"), _turn("b", 0.75)]), 2, 2),
        (Episode(0, HI, [_turn("a"), _turn("b", None)]), 2, 2),
        (Episode(0, HI, [_turn("a", done=True)], stop="done"), 1, 1),
        (Episode(0, HI, [_turn("a")], stop="max_turns"), 2, 2),  # stopped before turn 2
        (Episode(0, HI, [_turn("a"), Turn("go", reward=0.0)], stop="error", error="boom"), 2, 2),
    ],
)
def test_the_first_difference_is_found(replayed, turns, want):
    found = replay_mismatch(RECORDED, replayed, turns)
    assert (None if found is None else found[0]) == want, found


def test_the_error_names_the_environment_the_row_and_the_turn():
    check_replay("e", "prompt row 3", RECORDED, Episode(0, HI, [_turn("a")]), 1)  # the same
    with pytest.raises(ReplayError) as err:
        check_replay("my_env", "prompt row 3", RECORDED, Episode(0, HI, [_turn("z")]), 1)
    assert isinstance(err.value, EnvError)  # one error line, as the environments' own errors
    line = str(err.value)
    assert line.startswith("--env my_env: prompt row 3, turn 1: replaying ")
    assert "observations" in line and "'z'" in line and "not deterministic" in line
    with pytest.raises(ReplayError, match=r"^--env my_env: prompt row 3, init: .*'ho'"):
        check_replay(
            "my_env", "prompt row 3", RECORDED, Episode(0, [{"role": "user", "content": "ho"}]), 1
        )
