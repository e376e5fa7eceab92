import doctest
import random

import pytest

import marlhf.judge.outcomes as stats_mod
from marlhf.judge.outcomes import bootstrap_ci, counts, length_controlled, summarize, win_rate


def test_doctests():
    assert doctest.testmod(stats_mod).failed == 0


def test_counts_and_win_rate_by_hand():
    out = ["a"] * 3 + ["b"] * 2 + ["tie"] * 4 + ["invalid"] * 1
    assert counts(out) == {"n": 10, "wins": 3, "ties": 4, "losses": 2, "invalid": 1}
    assert win_rate(out) == pytest.approx((3 + 4 / 2) / 9)
    assert win_rate(["invalid"]) is None
    with pytest.raises(ValueError):
        counts(["A"])


def test_bootstrap_matches_plain_loop_and_is_seeded():
    out = ["a"] * 6 + ["b"] * 3 + ["tie"] * 2 + ["invalid"]
    ci = bootstrap_ci(out, n_boot=500, seed=7)
    assert ci == bootstrap_ci(out, n_boot=500, seed=7)
    # independent reference: the same percentile bootstrap written as a plain loop
    rng = random.Random(7)
    scores = [1.0] * 6 + [0.0] * 3 + [0.5] * 2
    boots = []
    for _ in range(500):
        s = 0.0
        for x in rng.choices(scores, k=len(scores)):
            s += x
        boots.append(s / len(scores))
    boots.sort()
    assert ci == (boots[round(0.025 * 499)], boots[round(0.975 * 499)])
    assert ci[0] <= win_rate(out) <= ci[1]
    assert bootstrap_ci(["a"] * 5, n_boot=100) == (1.0, 1.0)
    assert bootstrap_ci(["invalid"]) is None


def test_length_control_by_hand():
    out = ["a", "a", "b", "tie"]
    len_a = [100, 50, 10, 20]
    len_b = [95, 100, 10, 19]  # pairs 0, 2, 3 within 10 %; pair 1 is a long-vs-short win
    lc = length_controlled(out, len_a, len_b, tolerance=0.10)
    assert lc["mean_length_a"] == 45.0 and lc["mean_length_b"] == 56.0
    assert lc["n_matched"] == 3
    assert lc["win_rate_matched"] == pytest.approx((1 + 0 + 0.5) / 3)


def test_summarize_keys():
    s = summarize(["a", "b"], [1, 1], [1, 1], n_boot=50)
    assert s["win_rate"] == 0.5 and "ties/2" in s["win_rate_definition"]
    assert s["length_control"]["n_matched"] == 2
