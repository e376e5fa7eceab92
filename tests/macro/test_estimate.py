"""marlhf.macro.estimate against hand-worked examples and a per-row loop reference."""

import doctest

import pytest
import torch

import marlhf.macro.estimate as estimate_module
from marlhf.macro.config import MacroConfig
from marlhf.macro.estimate import macro_advantages, macro_stats
from marlhf.macro.segments import build_segments
from marlhf.macro.termination import TerminationInputs, build_termination


def loop_weights(n: int, value_function: str) -> list[float]:
    if value_function == "equal":
        return [1.0 / n] * n
    if value_function == "unit":
        return [0.0] * (n - 1) + [1.0]
    raw = [1.0 / (j + 1) for j in range(n)]
    return [w / sum(raw) for w in raw]


def loop_macro_advantages(
    rewards, values, macro_end, n_valid, value_function, reward_agg, gamma, lam
):
    """One row, plain Python: group tokens, aggregate, textbook GAE over macro steps, broadcast."""
    macros, current = [], []
    for t in range(n_valid):
        current.append(t)
        if macro_end[t]:
            macros.append(current)
            current = []
    V, R = [], []
    for tokens in macros:
        w = loop_weights(len(tokens), value_function)
        V.append(sum(wi * values[t] for wi, t in zip(w, tokens, strict=True)))
        if reward_agg == "sum":
            R.append(sum(rewards[t] for t in tokens))
        else:
            R.append(sum(wi * rewards[t] for wi, t in zip(w, tokens, strict=True)))
    K = len(macros)
    adv_k, last = [0.0] * K, 0.0
    for k in reversed(range(K)):
        next_v = V[k + 1] if k + 1 < K else 0.0
        last = R[k] + gamma * next_v - V[k] + gamma * lam * last
        adv_k[k] = last
    adv = [0.0] * len(rewards)
    ret = [0.0] * len(rewards)
    for k, tokens in enumerate(macros):
        for t in tokens:
            adv[t], ret[t] = adv_k[k], adv_k[k] + V[k]
    return adv, ret


def random_batch(seed, B=8, A=24):
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(0, A + 1, (B,), generator=g)
    n_valid[:3] = torch.tensor([A, 0, 1])
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    macro_end = (torch.rand(B, A, generator=g) < 0.35) | (torch.arange(A) == (n_valid - 1)[:, None])
    macro_end &= mask
    rewards = torch.randn(B, A, generator=g, dtype=torch.float64)
    values = torch.randn(B, A, generator=g, dtype=torch.float64)
    rewards[~mask] = float("nan")
    values[~mask] = float("nan")
    return rewards, values, mask, macro_end, n_valid


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("value_function", ["equal", "position", "unit"])
@pytest.mark.parametrize("reward_agg", ["sum", "weighted"])
def test_macro_advantages_match_loop(seed, value_function, reward_agg):
    rewards, values, mask, macro_end, n_valid = random_batch(seed)
    seg = build_segments(macro_end, mask)
    gamma, lam = 0.97, 0.9
    adv, ret = macro_advantages(
        rewards, values, mask, seg,
        value_function=value_function, reward_agg=reward_agg, gamma=gamma, lam=lam,
    )  # fmt: skip
    for b in range(mask.shape[0]):
        ref_adv, ref_ret = loop_macro_advantages(
            rewards[b].tolist(), values[b].tolist(), macro_end[b].tolist(), int(n_valid[b]),
            value_function, reward_agg, gamma, lam,
        )  # fmt: skip
        assert adv[b].tolist() == pytest.approx(ref_adv, abs=1e-12)
        assert ret[b].tolist() == pytest.approx(ref_ret, abs=1e-12)


def textbook_token_gae(rewards, values, n_valid, gamma, lam):
    adv, last = [0.0] * len(rewards), 0.0
    for t in reversed(range(n_valid)):
        next_v = values[t + 1] if t + 1 < n_valid else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, [adv[t] + values[t] if t < n_valid else 0.0 for t in range(len(rewards))]


@pytest.mark.parametrize("value_function", ["equal", "position", "unit"])
@pytest.mark.parametrize("reward_agg", ["sum", "weighted"])
def test_fixed_n1_is_exactly_token_ppo(value_function, reward_agg):
    rewards, values, mask, _, n_valid = random_batch(11)
    B, A = mask.shape
    inputs = TerminationInputs(
        response_ids=torch.zeros(B, A, dtype=torch.long),
        action_mask=mask,
        ends_with_eos=torch.ones(B, dtype=torch.bool),
    )
    out = build_termination(MacroConfig(termination_condition="fixed", ngram=1))(inputs)
    seg = build_segments(out.macro_end, mask)
    adv, ret = macro_advantages(
        rewards, values, mask, seg,
        value_function=value_function, reward_agg=reward_agg, gamma=1.0, lam=0.95,
    )  # fmt: skip
    for b in range(B):
        ref_adv, ref_ret = textbook_token_gae(
            rewards[b].tolist(), values[b].tolist(), int(n_valid[b]), 1.0, 0.95
        )
        assert adv[b].tolist() == ref_adv  # identical, not merely close
        assert ret[b].tolist() == ref_ret


def test_worked_example_two_macro_actions():
    # 5 tokens, macro actions w0 = {0, 1, 2}, w1 = {3, 4}; gamma = 1, lam = 0.5.
    # r = (-0.1, -0.2, 0.0, -0.1, 2.0), v = (0.3, 0.6, 0.9, 1.2, 0.8)
    rewards = torch.tensor([[-0.1, -0.2, 0.0, -0.1, 2.0]], dtype=torch.float64)
    values = torch.tensor([[0.3, 0.6, 0.9, 1.2, 0.8]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    seg = build_segments(torch.tensor([[0, 0, 1, 0, 1]]).bool(), mask)
    kw = dict(gamma=1.0, lam=0.5)

    # equal + sum: V0 = 1.8/3 = 0.6, V1 = 2.0/2 = 1.0; R0 = -0.3, R1 = 1.9.
    # d1 = 1.9 + 0 - 1.0 = 0.9 -> A1 = 0.9; d0 = -0.3 + 1.0 - 0.6 = 0.1 -> A0 = 0.1 + 0.5*0.9 = 0.55
    # G0 = 0.55 + 0.6 = 1.15, G1 = 0.9 + 1.0 = 1.9
    adv, ret = macro_advantages(rewards, values, mask, seg, value_function="equal", **kw)
    torch.testing.assert_close(
        adv, torch.tensor([[0.55, 0.55, 0.55, 0.9, 0.9]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        ret, torch.tensor([[1.15, 1.15, 1.15, 1.9, 1.9]], dtype=torch.float64)
    )

    # equal + weighted (the original): R0 = -0.3/3 = -0.1, R1 = 1.9/2 = 0.95.
    # d1 = 0.95 - 1.0 = -0.05 -> A1 = -0.05; d0 = -0.1 + 1.0 - 0.6 = 0.3 -> A0 = 0.3 - 0.025 = 0.275
    adv, ret = macro_advantages(
        rewards, values, mask, seg, value_function="equal", reward_agg="weighted", **kw
    )
    torch.testing.assert_close(
        adv, torch.tensor([[0.275, 0.275, 0.275, -0.05, -0.05]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        ret, torch.tensor([[0.875, 0.875, 0.875, 0.95, 0.95]], dtype=torch.float64)
    )

    # unit + sum: V0 = v2 = 0.9, V1 = v4 = 0.8; R0 = -0.3, R1 = 1.9.
    # d1 = 1.9 - 0.8 = 1.1 -> A1 = 1.1; d0 = -0.3 + 0.8 - 0.9 = -0.4 -> A0 = -0.4 + 0.55 = 0.15
    adv, ret = macro_advantages(rewards, values, mask, seg, value_function="unit", **kw)
    torch.testing.assert_close(
        adv, torch.tensor([[0.15, 0.15, 0.15, 1.1, 1.1]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        ret, torch.tensor([[1.05, 1.05, 1.05, 1.9, 1.9]], dtype=torch.float64)
    )

    # position + sum: w0 = (6, 3, 2)/11 -> V0 = (1.8 + 1.8 + 1.8)/11 = 5.4/11;
    # w1 = (2, 1)/3 -> V1 = (2.4 + 0.8)/3 = 3.2/3.
    # d1 = 1.9 - 3.2/3 -> A1 = 2.5/3; d0 = -0.3 + 3.2/3 - 5.4/11 -> A0 = d0 + 0.5 * 2.5/3
    adv, _ = macro_advantages(rewards, values, mask, seg, value_function="position", **kw)
    a1 = 2.5 / 3
    a0 = -0.3 + 3.2 / 3 - 5.4 / 11 + 0.5 * a1
    torch.testing.assert_close(adv, torch.tensor([[a0, a0, a0, a1, a1]], dtype=torch.float64))


def test_rejects_mismatched_mask_and_bad_agg():
    mask = torch.ones(1, 3, dtype=torch.bool)
    seg = build_segments(torch.tensor([[0, 0, 1]]).bool(), mask)
    with pytest.raises(ValueError, match="agree"):
        macro_advantages(
            torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[1, 1, 0]]).bool(), seg
        )
    with pytest.raises(ValueError, match="--macro_reward_agg"):
        macro_advantages(torch.zeros(1, 3), torch.zeros(1, 3), mask, seg, reward_agg="mean")


def test_macro_stats_by_hand():
    # Row 0: macros of 2, 3, 1 tokens; row 1: one macro of 4 tokens; row 2: empty.
    macro_end = torch.tensor(
        [[0, 1, 0, 0, 1, 1], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool
    )
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool
    )
    stats = macro_stats(build_segments(macro_end, mask), torch.tensor([False, True, False]))
    assert stats == {
        "macro/count": pytest.approx(4 / 3),
        "macro/mean_len": pytest.approx(10 / 4),
        "macro/max_len": 4.0,
        "macro/fallbacks": 1.0,
    }
    assert macro_stats(build_segments(macro_end, mask))["macro/fallbacks"] == 0.0


def test_doctests():
    assert doctest.testmod(estimate_module).failed == 0
