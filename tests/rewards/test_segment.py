import doctest
import json
import math

import pytest
import torch

import marlhf.rewards.segment as reward_norm
from marlhf.rewards.segment import (
    LocationNormalizer,
    ScoreStats,
    fit_location_normalizer,
    half_normal_huber_factor,
    huber_regression,
    segment_positions,
    segment_readout,
    segment_score,
)


def test_doctests():
    assert doctest.testmod(reward_norm).failed == 0


def test_segment_readout_reads_the_last_token_of_each_macro_action():
    # Full sequences of length T = 10; value at (b, t) = 100*b + t so positions are readable.
    values = (100 * torch.arange(3).unsqueeze(1) + torch.arange(10)).float()  # (B=3, T=10)
    response_start = torch.tensor([2, 4, 0])
    # Row 0: response of 6 tokens cut 2 | 3 | 1      -> ends at j = 1, 4, 5
    # Row 1: response of 4 tokens, one macro action  -> ends at j = 3
    # Row 2: response of 5 tokens cut 1 | 1 | 2 | 1  -> ends at j = 0, 1, 3, 4 (A = 6: one pad)
    macro_end = torch.tensor(
        [
            [0, 1, 0, 0, 1, 1],
            [0, 0, 0, 1, 0, 0],
            [1, 1, 0, 1, 1, 0],
        ],
        dtype=torch.bool,
    )
    rewards, mask = segment_readout(values, response_start, macro_end)
    # Hand-worked: position = start + j.
    expected = [
        [2 + 1, 2 + 4, 2 + 5, 0],
        [100 + 4 + 3, 0, 0, 0],
        [200 + 0, 200 + 1, 200 + 3, 200 + 4],
    ]
    assert rewards.tolist() == [[float(v) for v in row] for row in expected]
    assert mask.tolist() == [
        [True, True, True, False],
        [True, False, False, False],
        [True, True, True, True],
    ]


def test_segment_readout_matches_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    B, T, A = 6, 20, 9
    values = torch.randn(B, T, generator=g)
    lengths = torch.randint(1, A + 1, (B,), generator=g)
    response_start = torch.randint(0, T - A + 1, (B,), generator=g)
    macro_end = torch.rand(B, A, generator=g) < 0.4
    macro_end &= torch.arange(A) < lengths.unsqueeze(1)
    macro_end[torch.arange(B), lengths - 1] = True
    rewards, mask = segment_readout(values, response_start, macro_end)
    for b in range(B):
        ends = [j for j in range(A) if macro_end[b, j]]
        assert mask[b].sum().item() == len(ends)
        for k, j in enumerate(ends):
            assert rewards[b, k].item() == values[b, response_start[b] + j].item()
        assert (rewards[b, len(ends) :] == 0).all()


def test_segment_readout_with_explicit_action_mask_and_empty_rows():
    values = torch.arange(12.0).reshape(2, 6)
    macro_end = torch.tensor([[False, True, False, True], [False, False, False, False]])
    action_mask = torch.tensor([[True, True, True, True], [False, False, False, False]])
    rewards, mask = segment_readout(values, torch.tensor([1, 0]), macro_end, action_mask)
    assert rewards.tolist() == [[2.0, 4.0], [0.0, 0.0]]
    assert mask.tolist() == [[True, True], [False, False]]
    assert segment_score(rewards, mask).tolist() == [3.0, 0.0]


def test_segment_readout_rejects_ends_beyond_the_sequence():
    with pytest.raises(ValueError, match="beyond"):
        segment_readout(torch.zeros(1, 4), torch.tensor([2]), torch.tensor([[False, False, True]]))


def test_segment_positions_and_score():
    mask = torch.tensor([[True, True, True, True], [True, False, False, False], [False] * 4])
    assert segment_positions(mask).tolist() == [
        [0.25, 0.5, 0.75, 1.0],
        [1.0, 0, 0, 0],
        [0, 0, 0, 0],
    ]
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
    assert segment_score(rewards, mask).tolist() == [3.0, 5.0, 0.0]


def test_huber_regression_exact_line_and_constant_x():
    x = torch.linspace(0, 1, 50, dtype=torch.float64)
    assert huber_regression(x, 3 * x - 2) == pytest.approx((3.0, -2.0), abs=1e-9)
    # Constant x: slope 0, intercept = a robust location (the lone outlier barely moves it).
    y = torch.tensor([1.0, 1.1, 0.9, 1.05, 0.95, 50.0])
    slope, loc = huber_regression(torch.zeros(6), y)
    assert slope == 0.0
    assert 0.9 < loc < 1.2


def test_half_normal_factor_is_below_the_mean():
    # The Huber location of a right-skewed variable with mean 1 lies below 1, near the range
    # between the median sqrt(pi/2) * 0.6745 = 0.845 and the mean.
    kappa = half_normal_huber_factor()
    assert 0.85 < kappa < 1.0


def _draw(a, b, c, d, n, gen):
    K = torch.randint(1, 25, (n,), generator=gen)
    k = torch.floor(torch.rand(n, generator=gen) * K) + 1
    p = k / K
    sigma = b * torch.log(p) + d
    r = a * torch.log(p) + c + sigma * torch.randn(n, generator=gen)
    return r.double(), p.double()


def test_fit_recovers_known_parameters():
    a, b, c, d = 0.3, -0.2, 1.0, 0.5
    r, p = _draw(a, b, c, d, 20_000, torch.Generator().manual_seed(0))
    fit = fit_location_normalizer(r, p)
    assert fit.a == pytest.approx(a, abs=0.03)
    assert fit.c == pytest.approx(c, abs=0.03)
    assert fit.b == pytest.approx(b, abs=0.03)
    assert fit.d == pytest.approx(d, abs=0.03)
    # After normalisation the rewards are standard at every position (independent check).
    z = fit.apply(r, p)
    for lo, hi in [(0.0, 0.2), (0.2, 0.6), (0.6, 1.0)]:
        sel = (p > lo) & (p <= hi)
        assert z[sel].mean().item() == pytest.approx(0.0, abs=0.06)
        assert z[sel].std().item() == pytest.approx(1.0, abs=0.06)


def _ols(x, y):
    xm, ym = x.mean(), y.mean()
    slope = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum()
    return float(slope), float(ym - slope * xm)


def test_fit_is_robust_to_outliers():
    a, b, c, d = -0.4, -0.1, 0.5, 0.3
    gen = torch.Generator().manual_seed(1)
    r, p = _draw(a, b, c, d, 20_000, gen)
    # 3 % of rewards are wild (e.g. a broken response scored +-40).
    bad = torch.rand(r.shape, generator=gen) < 0.03
    sign = torch.where(torch.rand(r.shape, generator=gen) < 0.5, -1.0, 1.0).double()
    r_bad = torch.where(bad, r + 40 * sign, r)
    fit = fit_location_normalizer(r_bad, p)
    assert fit.a == pytest.approx(a, abs=0.05)
    assert fit.c == pytest.approx(c, abs=0.05)
    assert fit.b == pytest.approx(b, abs=0.05)
    assert fit.d == pytest.approx(d, abs=0.05)
    # Ordinary least squares of |residual| is thrown far off by the same outliers.
    log_p = torch.log(p)
    ols_a, ols_c = _ols(log_p, r_bad)
    resid = (r_bad - (ols_a * log_p + ols_c)).abs() * math.sqrt(math.pi / 2)
    _, ols_d = _ols(log_p, resid)
    assert abs(ols_d - d) > 0.5


def test_fit_with_mask_ignores_padding():
    r, p = _draw(0.2, 0.0, 0.0, 1.0, 4000, torch.Generator().manual_seed(2))
    rewards = torch.stack([r, torch.full_like(r, 1e6)], dim=1)  # (N, 2): column 1 is padding
    positions = torch.stack([p, torch.zeros_like(p)], dim=1)
    mask = torch.stack(
        [torch.ones_like(p, dtype=torch.bool), torch.zeros_like(p, dtype=torch.bool)], 1
    )
    assert fit_location_normalizer(rewards, positions, mask) == fit_location_normalizer(r, p)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        fit_location_normalizer(rewards, positions)


def test_normalizer_apply_by_hand_with_floor_mask_and_clip():
    norm = LocationNormalizer(a=1.0, b=-0.5, c=2.0, d=0.1, sigma_floor=0.05)
    p = torch.tensor([[1.0, 0.5, 0.25]])
    r = torch.tensor([[3.0, 2.0, 100.0]])
    out = norm.apply(r, p)
    # p=1: mu=2, sigma=0.1; p=0.5: mu=2-ln2, sigma=0.1+0.5 ln2; p=.25: mu=2-ln4, sigma=0.1+0.5 ln4
    ln2, ln4 = math.log(2), math.log(4)
    expected = [
        (3 - 2) / 0.1,
        (2 - (2 - ln2)) / (0.1 + 0.5 * ln2),
        (100 - (2 - ln4)) / (0.1 + 0.5 * ln4),
    ]
    assert out[0].tolist() == pytest.approx(expected, rel=1e-5)
    # Floor: sigma(p) = b ln p + d < floor for large p when b > 0.
    low = LocationNormalizer(a=0.0, b=1.0, c=0.0, d=0.0, sigma_floor=0.05)
    assert low.std(torch.tensor([0.5])).item() == pytest.approx(0.05)
    mask = torch.tensor([[True, True, False]])
    masked = norm.apply(r, p, mask=mask, clip=5.0)
    assert masked[0].tolist() == pytest.approx([5.0, expected[1], 0.0], rel=1e-5)
    # Padding positions (p = 0) stay finite.
    assert torch.isfinite(norm.apply(r, torch.zeros_like(p), mask=torch.zeros_like(mask))).all()


def test_round_trips_through_json():
    norm = LocationNormalizer(a=0.1, b=-0.2, c=0.3, d=0.4, sigma_floor=0.01)
    assert LocationNormalizer.from_dict(json.loads(json.dumps(norm.to_dict()))) == norm
    stats = ScoreStats.from_scores(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert stats.mean == 2.5 and stats.std == pytest.approx(math.sqrt(1.25))
    assert ScoreStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats
    assert stats.normalize(torch.tensor([2.5])).item() == 0.0
