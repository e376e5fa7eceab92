"""The statistics module against hand-worked values and table entries."""

import doctest
import math
import random
import statistics

import pytest

import marlhf.stats as stats


def test_doctests():
    result = doctest.testmod(stats)
    assert result.attempted > 0 and result.failed == 0


def test_t975_table_values():
    # standard table values
    assert stats.t975(1) == 12.706
    assert stats.t975(3) == 3.182
    assert stats.t975(30) == 2.042
    assert stats.t975(2.99) == 4.303  # floored: conservative
    assert stats.t975(500) == 1.96
    with pytest.raises(ValueError):
        stats.t975(0.5)


def test_mean_ci_hand_worked():
    # [2, 4, 6, 8]: mean 5, sd sqrt(20/3) = 2.5820, se 1.2910, t_3 = 3.182 -> 4.1079
    m, h = stats.mean_ci([2.0, 4.0, 6.0, 8.0])
    assert m == 5.0
    assert h == pytest.approx(3.182 * math.sqrt(20 / 3) / 2, abs=1e-12)
    assert h == pytest.approx(4.1079, abs=1e-4)
    m, h = stats.mean_ci([0.7])
    assert m == 0.7 and math.isnan(h)
    assert stats.mean_ci([3.0, 3.0, 3.0]) == (3.0, 0.0)


def test_welch_diff_ci_hand_worked():
    # a = [1,2,3]: var/n = 1/3; b = [2,4,6]: var/n = 4/3; sum 5/3
    # df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17 = 2.94 -> t_2 = 4.303
    d, h = stats.welch_diff_ci([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert d == pytest.approx(-2.0)
    assert h == pytest.approx(4.303 * math.sqrt(5 / 3), abs=1e-12)
    assert h == pytest.approx(5.5551, abs=1e-4)
    # zero spread on both sides: exact difference
    assert stats.welch_diff_ci([1.0, 1.0], [0.5, 0.5]) == (0.5, 0.0)


def test_percentile_nearest_rank():
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert stats.percentile(xs, 0.025) == 3.0  # ceil(2.5) = 3rd value
    assert stats.percentile(xs, 0.975) == 98.0
    assert stats.percentile([5.0], 0.025) == 5.0
    with pytest.raises(ValueError):
        stats.percentile([], 0.5)


def test_welch_hand_worked():
    # a: mean 2.5, var 5/3; b: mean 1, var 1. se^2 = 5/12 + 1/3 = 0.75;
    # df = 0.75^2 / ((5/12)^2/3 + (1/3)^2/2) = 4.96 -> t(4) = 2.776
    d, h = stats.welch_diff_ci([1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0])
    assert d == 1.5 and h == pytest.approx(2.776 * math.sqrt(0.75))


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    rng = random.Random(0)
    small = [rng.gauss(0.0, 1.0) for _ in range(30)]
    large = [rng.gauss(0.0, 1.0) for _ in range(3000)]
    lo_s, hi_s = stats.bootstrap_mean_ci(small)
    lo_l, hi_l = stats.bootstrap_mean_ci(large, n_boot=500)
    assert lo_s < statistics.fmean(small) < hi_s
    assert lo_l < statistics.fmean(large) < hi_l
    # half-width ~ 1.96 sd / sqrt(n): ~0.36 for n=30, ~0.036 for n=3000
    assert 0.2 < (hi_s - lo_s) / 2 < 0.55
    assert 0.02 < (hi_l - lo_l) / 2 < 0.05
    assert stats.bootstrap_mean_ci(small, seed=3) == stats.bootstrap_mean_ci(small, seed=3)


def test_pearson_against_a_hand_worked_value():
    assert stats.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert stats.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # x = 1..4, y = 1,3,2,4: cov 1.0*... = r 0.8
    assert stats.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(stats.pearson([1, 1, 1], [1, 2, 3]))


def test_non_finite_values_give_no_interval_instead_of_raising():
    inf, nan = float("inf"), float("nan")
    m, h = stats.mean_ci([inf, 1.0])
    assert m == inf and math.isnan(h)
    m, h = stats.mean_ci([nan, 1.0, 2.0])
    assert math.isnan(m) and math.isnan(h)
    d, h = stats.welch_diff_ci([1.0, inf], [0.0, 1.0])
    assert d == inf and math.isnan(h)
    d, h = stats.welch_diff_ci([1.0, 2.0], [nan, 1.0])
    assert math.isnan(d) and math.isnan(h)
    m, sd = stats.mean_sd([-inf, 2.0])
    assert m == -inf and math.isnan(sd)
