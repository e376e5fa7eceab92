"""Tests for marlhf.algo.kl_rewards against closed forms, per-row loops and hand-stepped controllers."""

import doctest
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import marlhf.algo.kl_rewards as rewards_mod
from marlhf.algo.kl_rewards import (
    AdaptiveKLController,
    FixedKLController,
    compose_rewards,
    kl_penalty,
    normalize_scores,
    sequence_rewards,
    spread_segment_rewards,
    token_rewards,
)

# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_closed_form():
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.4)]])
    d = [math.log(2.0), math.log(0.5)]  # logp - ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([d]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[x * x / 2 for x in d]]))
    # r = ref / p = 1/2 and 2: (r - 1) - log r
    k3 = [(0.5 - 1) - math.log(0.5), (2 - 1) - math.log(2.0)]
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([k3]))


def test_kl_estimators_zero_when_equal():
    x = torch.randn(3, 4)
    for est in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(x, x, est), torch.zeros(3, 4))


@settings(max_examples=50, deadline=None)
@given(st.floats(-30, 0), st.floats(-30, 0))
def test_k3_and_k2_nonnegative(a, b):
    logp, ref = torch.tensor([[a]]), torch.tensor([[b]])
    assert kl_penalty(logp, ref, "k3").item() >= 0.0
    assert kl_penalty(logp, ref, "k2").item() >= 0.0


def test_k1_and_k3_unbiased_for_exact_kl():
    """Sampling a ~ pi, E[k1] = E[k3] = KL(pi || pi_ref) (Monte Carlo, loose tolerance)."""
    pi = torch.tensor([0.5, 0.3, 0.2])
    ref = torch.tensor([0.2, 0.3, 0.5])
    exact = float((pi * (pi / ref).log()).sum())
    g = torch.Generator().manual_seed(0)
    a = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    logp, ref_logp = pi.log()[a].unsqueeze(0), ref.log()[a].unsqueeze(0)
    for est in ("k1", "k3"):
        assert abs(kl_penalty(logp, ref_logp, est).mean().item() - exact) < 0.01


def test_kl_penalty_rejects_unknown_estimator_and_shapes():
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3))


# ---------------------------------------------------------------- compose_rewards


def _reference_compose(kl, scores, mask, kl_coef, clip, eos, penalty, dense):
    B, A = mask.shape
    out = [[0.0] * A for _ in range(B)]
    for b in range(B):
        valid = [t for t in range(A) if mask[b, t]]
        for t in valid:
            out[b][t] = -kl_coef * float(kl[b, t]) + (
                float(dense[b, t]) if dense is not None else 0.0
            )
        if valid:
            s = float(scores[b])
            if clip is not None:
                s = min(max(s, -clip), clip)
            if eos is not None and not bool(eos[b]):
                s += penalty
            out[b][valid[-1]] += s
    return torch.tensor(out)


def test_compose_rewards_hand_example_batch_with_truncation():
    # Row 0: 3 tokens, ended with EOS; row 1: 2 tokens, truncated (no EOS); row 2: full length 4,
    # truncated, score above the clip.
    kl = torch.tensor([[0.2, 0.4, 0.6, 9.0], [1.0, -1.0, 9.0, 9.0], [0.0, 0.0, 0.0, 0.2]])
    mask = torch.tensor(
        [[True, True, True, False], [True, True, False, False], [True, True, True, True]]
    )
    scores = torch.tensor([1.0, -0.5, 4.0])
    eos = torch.tensor([True, False, False])
    out = compose_rewards(
        kl, scores, mask, kl_coef=0.5, reward_clip=2.5, ends_with_eos=eos, no_eos_penalty=-1.0
    )
    expected = torch.tensor(
        [
            [-0.1, -0.2, -0.3 + 1.0, 0.0],
            [-0.5, 0.5 - 0.5 - 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, -0.1 + 2.5 - 1.0],
        ]
    )
    torch.testing.assert_close(out, expected)


def test_compose_rewards_matches_loop_random():
    g = torch.Generator().manual_seed(1)
    B, A = 6, 7
    lengths = torch.tensor([0, 1, 3, 7, 5, 2])
    mask = torch.arange(A).unsqueeze(0) < lengths.unsqueeze(1)
    kl = torch.randn(B, A, generator=g)
    scores = 3 * torch.randn(B, generator=g)
    eos = torch.rand(B, generator=g) > 0.5
    dense = torch.randn(B, A, generator=g)
    for clip in (None, 1.0):
        out = compose_rewards(
            kl,
            scores,
            mask,
            kl_coef=0.1,
            reward_clip=clip,
            ends_with_eos=eos,
            no_eos_penalty=-0.05,
            dense=dense,
        )
        ref = _reference_compose(kl, scores, mask, 0.1, clip, eos, -0.05, dense)
        torch.testing.assert_close(out, ref)
        assert torch.all(out[~mask] == 0)
    # Empty row 0 gets nothing, not even the score.
    assert torch.all(out[0] == 0)


def test_token_and_sequence_rewards_are_compose_rewards_parts():
    """The two parts (for estimators that take the score apart) by a loop, and compose_rewards
    equals the per-token part with the sequence part added on the last valid token, bit for bit."""
    g = torch.Generator().manual_seed(2)
    B, A = 6, 7
    lengths = torch.tensor([0, 1, 3, 7, 5, 2])
    mask = torch.arange(A).unsqueeze(0) < lengths.unsqueeze(1)
    kl, dense = torch.randn(2, B, A, generator=g)
    scores = 3 * torch.randn(B, generator=g)
    eos = torch.tensor([True, False, True, False, True, False])
    kw = dict(reward_clip=1.0, ends_with_eos=eos, no_eos_penalty=-0.05)
    tok = token_rewards(kl, mask, kl_coef=0.1, dense=dense)
    seq = sequence_rewards(scores, mask, **kw)
    for b in range(B):
        n = int(lengths[b])
        want = [-0.1 * float(kl[b, t]) + float(dense[b, t]) for t in range(n)] + [0.0] * (A - n)
        assert tok[b].tolist() == pytest.approx(want, abs=1e-6)
        s = min(max(float(scores[b]), -1.0), 1.0) + (0.0 if eos[b] else -0.05)
        assert seq[b].item() == pytest.approx(s if n > 0 else 0.0, abs=1e-6)
    combined = tok.clone()
    for b in range(B):
        if lengths[b] > 0:
            combined[b, lengths[b] - 1] += seq[b]
    out = compose_rewards(kl, scores, mask, kl_coef=0.1, dense=dense, **kw)
    assert torch.equal(out, combined)


def test_compose_rewards_score_never_on_padding():
    mask = torch.tensor([[True, False, False], [True, True, True]])
    out = compose_rewards(torch.zeros(2, 3), torch.tensor([1.0, 2.0]), mask, kl_coef=0.0)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]))


def test_compose_rewards_validation():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="scores"):
        compose_rewards(torch.zeros(2, 3), torch.zeros(3), mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl"):
        compose_rewards(torch.zeros(2, 4), torch.zeros(2), mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="reward_clip"):
        compose_rewards(torch.zeros(2, 3), torch.zeros(2), mask, kl_coef=0.1, reward_clip=0.0)


# ---------------------------------------------------------------- segment rewards


def _reference_spread(seg_rewards, ids, mode):
    B, A = ids.shape
    out = torch.zeros(B, A)
    for b in range(B):
        members = {}
        for t in range(A):
            k = int(ids[b, t])
            if k >= 0:
                members.setdefault(k, []).append(t)
        for k, ts in members.items():
            r = float(seg_rewards[b, k])
            if mode == "interpolate":
                for t in ts:
                    out[b, t] = r / len(ts)
            else:
                out[b, ts[-1]] = r
    return out


def test_spread_segment_rewards_hand_example():
    ids = torch.tensor([[0, 0, 0, 1, 2, 2], [0, 1, 1, -1, -1, -1]])
    seg = torch.tensor([[3.0, 1.0, -2.0], [4.0, 2.0, 99.0]])
    torch.testing.assert_close(
        spread_segment_rewards(seg, ids, "interpolate"),
        torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0], [4.0, 1.0, 1.0, 0.0, 0.0, 0.0]]),
    )
    torch.testing.assert_close(
        spread_segment_rewards(seg, ids, "last"),
        torch.tensor([[0.0, 0.0, 3.0, 1.0, 0.0, -2.0], [4.0, 0.0, 2.0, 0.0, 0.0, 0.0]]),
    )


@pytest.mark.parametrize("mode", ["interpolate", "last"])
def test_spread_segment_rewards_matches_loop_and_conserves_sum(mode):
    g = torch.Generator().manual_seed(2)
    B, A, M = 5, 12, 12
    ids = torch.full((B, A), -1)
    for b in range(B):  # random contiguous segments of random lengths, random response length
        length = int(torch.randint(0, A + 1, (1,), generator=g))
        k, t = 0, 0
        while t < length:
            n = int(torch.randint(1, 4, (1,), generator=g))
            ids[b, t : min(length, t + n)] = k
            t += n
            k += 1
    seg = torch.randn(B, M, generator=g)
    out = spread_segment_rewards(seg, ids, mode)
    torch.testing.assert_close(out, _reference_spread(seg, ids, mode))
    counts = (ids.max(dim=1).values + 1).tolist()
    for b in range(B):  # the tokens of each row carry exactly its segments' total reward
        torch.testing.assert_close(out[b].sum(), seg[b, : counts[b]].sum())


def test_spread_segment_rewards_rejects_unknown_mode():
    with pytest.raises(ValueError, match="segment_reward_mode"):
        spread_segment_rewards(torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.long), "first")


def test_normalize_scores():
    torch.testing.assert_close(
        normalize_scores(torch.tensor([0.0, 4.0]), mean=1.0, std=2.0), torch.tensor([-0.5, 1.5])
    )
    torch.testing.assert_close(
        normalize_scores(
            torch.tensor([0.0, 4.0]), torch.tensor([0.0, 2.0]), torch.tensor([1.0, 4.0])
        ),
        torch.tensor([0.0, 0.5]),
    )
    with pytest.raises(ValueError, match="std"):
        normalize_scores(torch.zeros(2), 0.0, 0.0)


# ---------------------------------------------------------------- KL controllers


def test_adaptive_kl_controller_hand_stepped():
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    ctl.update(3.0, n_steps=256)  # 3/6 - 1 = -0.5 -> clipped to -0.2: 0.2 * (1 - 0.2 * 0.0256)
    assert ctl.value == pytest.approx(0.198976, abs=1e-12)
    ctl.update(6.6, n_steps=512)  # error +0.1: * (1 + 0.1 * 0.0512)
    assert ctl.value == pytest.approx(0.198976 * 1.00512, abs=1e-12)
    ctl.update(torch.tensor(100.0), n_steps=1000)  # clipped +0.2: * 1.02
    assert ctl.value == pytest.approx(0.198976 * 1.00512 * 1.02, abs=1e-12)
    ctl.update(6.0, n_steps=1000)  # on target: unchanged
    assert ctl.value == pytest.approx(0.198976 * 1.00512 * 1.02, abs=1e-12)


def test_kl_controllers_state_dict_resume():
    a = AdaptiveKLController(0.1, target=5.0, horizon=100)
    a.update(7.0, 10)
    b = AdaptiveKLController(0.1, target=5.0, horizon=100)
    b.load_state_dict(a.state_dict())
    a.update(2.0, 10)
    b.update(2.0, 10)
    assert a.value == b.value
    f = FixedKLController(0.05)
    f.update(10.0, 100)
    assert f.value == 0.05
    g = FixedKLController(1.0)
    g.load_state_dict(f.state_dict())
    assert g.value == 0.05


def test_kl_controller_validation():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="kl_horizon"):
        AdaptiveKLController(0.1, target=1.0, horizon=0)
    with pytest.raises(ValueError, match="kl_ctl"):
        FixedKLController(-0.1)


def test_docstring_examples():
    assert doctest.testmod(rewards_mod).failed == 0
