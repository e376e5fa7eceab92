"""marlhf.algo.gae against a textbook per-row GAE loop."""

import doctest

import pytest
import torch

import marlhf.algo.gae as gae_module
from marlhf.algo.gae import gae, whiten


def textbook_gae(rewards, values, n_valid, gamma, lam):
    """cleanrl-style reverse loop over one row's valid steps, in Python floats."""
    adv = [0.0] * len(rewards)
    last = 0.0
    for t in reversed(range(n_valid)):
        next_value = values[t + 1] if t + 1 < n_valid else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    ret = [adv[t] + values[t] if t < n_valid else 0.0 for t in range(len(rewards))]
    return adv, ret


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_textbook_loop(seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    B, S = 6, 11
    n_valid = torch.randint(0, S + 1, (B,), generator=g)
    n_valid[0], n_valid[1] = S, 1
    mask = torch.arange(S)[None, :] < n_valid[:, None]
    rewards = torch.randn(B, S, generator=g, dtype=torch.float64)
    values = torch.randn(B, S, generator=g, dtype=torch.float64)
    values[~mask] = float("nan")  # garbage on padding must not leak
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for b in range(B):
        n = int(n_valid[b])
        ref_adv, ref_ret = textbook_gae(rewards[b].tolist(), values[b].tolist(), n, gamma, lam)
        # Same operations in the same order in IEEE double: identical, not just close.
        assert adv[b].tolist() == ref_adv
        assert ret[b].tolist() == ref_ret


def test_gae_hand_example():
    # r = (0, 0, 1), V = (0.2, 0.4, 0.6), gamma = 0.5, lam = 0.5
    # delta_2 = 1 - 0.6 = 0.4;             A_2 = 0.4
    # delta_1 = 0 + 0.5*0.6 - 0.4 = -0.1;  A_1 = -0.1 + 0.25*0.4 = 0.0
    # delta_0 = 0 + 0.5*0.4 - 0.2 = 0.0;   A_0 = 0.0 + 0.25*0.0 = 0.0
    adv, ret = gae(
        torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64),
        torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.bool),
        gamma=0.5,
        lam=0.5,
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, 0.4]], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([[0.2, 0.4, 1.0]], dtype=torch.float64))


def test_gae_rejects_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), 1.0, 1.0)


def test_whiten_matches_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64) * 3 + 2
    mask = torch.rand(4, 9, generator=g) < 0.7
    vals = [x[b, t].item() for b in range(4) for t in range(9) if mask[b, t]]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    out = whiten(x, mask)
    kept = whiten(x, mask, shift_mean=False)
    for b in range(4):
        for t in range(9):
            if mask[b, t]:
                z = (x[b, t].item() - mean) / (var + 1e-8) ** 0.5
                assert out[b, t].item() == pytest.approx(z)
                assert kept[b, t].item() == pytest.approx(z + mean)
            else:
                assert out[b, t] == 0 and kept[b, t] == 0


def test_doctests():
    assert doctest.testmod(gae_module).failed == 0
