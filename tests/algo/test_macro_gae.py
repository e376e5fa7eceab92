"""marlhf.algo.macro_gae against hand-worked examples and a per-row loop reference."""

import doctest
import itertools

import pytest
import torch

import marlhf.algo.macro_gae as estimate_module
from marlhf.algo.macro_gae import macro_advantages, macro_stats
from marlhf.macro.config import MacroConfig
from marlhf.macro.segments import build_segments
from marlhf.macro.termination import TerminationInputs, build_termination


def loop_weights(n: int, value_function: str) -> list[float]:
    if value_function == "equal":
        return [1.0 / n] * n
    if value_function == "unit":
        return [0.0] * (n - 1) + [1.0]
    if value_function == "start":
        return [1.0] + [0.0] * (n - 1)
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
@pytest.mark.parametrize("value_function", ["equal", "position", "unit", "start"])
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


@pytest.mark.parametrize("value_function", ["equal", "position", "unit", "start"])
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


def test_weighted_agg_keeps_a_truncated_rows_score_whole():
    """With `weighted`, a score given apart enters the last macro action whole, also in a truncated
    row. Row 0 is truncated: its last macro action {2, 3, 4} is an ordinary chunk; averaged with its
    KL rewards the score would give R1 = (-1.2 + 1.5) / 3 = 0.1, given apart it enters whole:
    R1 = -1.2 / 3 + 1.5 = 1.1. Row 1 ends with EOS, its own macro action {3}: the score is whole
    there either way."""
    kl_rewards = torch.tensor(
        [[-0.1, -0.2, -0.3, -0.6, -0.3], [-0.2, -0.4, -0.6, -0.5, 0.0]], dtype=torch.float64
    )
    scores = torch.tensor([1.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]).bool()
    seg = build_segments(torch.tensor([[0, 1, 0, 0, 1], [0, 0, 1, 1, 0]]).bool(), mask)
    values = torch.zeros(2, 5, dtype=torch.float64)
    kw = dict(value_function="equal", reward_agg="weighted", gamma=1.0, lam=1.0)
    adv, _ = macro_advantages(kl_rewards, values, mask, seg, scores=scores, **kw)
    # row 0: R0 = -0.3 / 2 = -0.15, R1 = 1.1 -> A1 = 1.1, A0 = 0.95
    # row 1: R0 = -1.2 / 3 = -0.4, R1 = -0.5 + 2.0 = 1.5 -> A1 = 1.5, A0 = 1.1
    want = torch.tensor(
        [[0.95, 0.95, 1.1, 1.1, 1.1], [1.1, 1.1, 1.1, 1.5, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(adv, want)
    # with the score added to the rewards instead (no `scores`), row 1 agrees and row 0 averages it
    combined = kl_rewards.clone()
    combined[0, 4] += 1.5
    combined[1, 3] += 2.0
    combined_adv, _ = macro_advantages(combined, values, mask, seg, **kw)
    torch.testing.assert_close(combined_adv[1], want[1])
    assert combined_adv[0, 4].item() == pytest.approx(0.1)  # the averaged score, documented above


@pytest.mark.parametrize("value_function", ["equal", "position", "unit", "start"])
def test_scores_apart_with_sum_is_bit_identical(value_function):
    rewards, values, mask, macro_end, n_valid = random_batch(5)
    seg = build_segments(macro_end, mask)
    scores = torch.randn(
        mask.shape[0], generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    combined = torch.where(mask, rewards, 0.0)
    for b in range(mask.shape[0]):
        if n_valid[b] > 0:
            combined[b, n_valid[b] - 1] += scores[b]
    kw = dict(value_function=value_function, reward_agg="sum", gamma=0.97, lam=0.9)
    want = macro_advantages(combined, values, mask, seg, **kw)
    got = macro_advantages(rewards, values, mask, seg, scores=scores, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_zero_width_batch():
    empty = torch.zeros(2, 0, dtype=torch.bool)
    seg = build_segments(empty, empty)
    for agg in ("sum", "weighted"):
        adv, ret = macro_advantages(
            torch.zeros(2, 0), torch.zeros(2, 0), empty, seg, reward_agg=agg, scores=torch.ones(2)
        )
        assert adv.shape == ret.shape == (2, 0)


# ---------------------------------------------------------------- value_function start is unbiased


def enumerated_policy_gradients(macro_end_row, value_functions, V=3, L=3, seed=0):
    """A tabular softmax policy over V tokens and L steps (logits depend on the whole prefix), a
    reward on the tokens (r_t = c[t, a_t] plus a score on the whole sequence) and an arbitrary,
    wrong critic V(s). Returns the true gradient of E[sum_t r_t] and, per value function, the exact
    expected policy gradient E[sum_t A_t grad log pi(a_t | s_t)] of macro GAE with lambda = gamma = 1,
    both by autograd over all V^L sequences weighted by their probability."""
    g = torch.Generator().manual_seed(seed)
    n_states = sum(V**t for t in range(L))
    theta = torch.randn(n_states, V, generator=g, dtype=torch.float64, requires_grad=True)
    critic = 3.0 * torch.randn(n_states, generator=g, dtype=torch.float64)
    token_reward = torch.randn(L, V, generator=g, dtype=torch.float64)
    final = torch.randn(V**L, generator=g, dtype=torch.float64)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=L)))  # (V^L, L)
    S = seqs.shape[0]
    state = torch.zeros(S, L, dtype=torch.long)  # index of the prefix seqs[:, :t]
    code = torch.zeros(S, dtype=torch.long)
    for t in range(L):
        state[:, t] = sum(V**j for j in range(t)) + code
        code = code * V + seqs[:, t]
    logp = torch.log_softmax(theta[state], -1).gather(2, seqs[..., None]).squeeze(2)  # (S, L)
    p = logp.sum(1).exp()
    rewards = token_reward[torch.arange(L), seqs]  # (S, L)
    rewards[:, -1] += final[code]
    (true_grad,) = torch.autograd.grad((p * rewards.sum(1)).sum(), theta, retain_graph=True)
    mask = torch.ones(S, L, dtype=torch.bool)
    seg = build_segments(torch.tensor(macro_end_row).bool().expand(S, L), mask)
    values = critic[state]  # the value at token t's position is V(s_t), the state before it
    grads = {}
    for vf in value_functions:
        adv, _ = macro_advantages(rewards, values, mask, seg, value_function=vf, gamma=1.0, lam=1.0)
        surrogate = (p.detach() * (adv.detach() * logp).sum(1)).sum()
        (grads[vf],) = torch.autograd.grad(surrogate, theta, retain_graph=True)
    return true_grad, grads


@pytest.mark.parametrize("macro_end_row", [[0, 1, 1], [1, 0, 1], [0, 0, 1]])
def test_start_value_gives_the_true_policy_gradient_and_the_others_do_not(macro_end_row):
    """With `start` the macro action's baseline is V at the state where it begins, which
    does not depend on its own tokens, so the expected policy gradient is the true gradient whatever
    the critic; `equal`, `position` and `unit` read states inside the macro action and are biased."""
    true_grad, grads = enumerated_policy_gradients(
        macro_end_row, ("start", "equal", "position", "unit")
    )
    assert float(true_grad.abs().max()) > 0.05  # a gradient worth comparing
    torch.testing.assert_close(grads["start"], true_grad, rtol=0, atol=1e-6)
    for vf in ("equal", "position", "unit"):
        assert float((grads[vf] - true_grad).abs().max()) > 1e-2, vf


def test_one_token_macro_actions_are_unbiased_with_every_weighting():
    true_grad, grads = enumerated_policy_gradients(
        [1, 1, 1], ("start", "equal", "position", "unit")
    )
    for vf, grad in grads.items():
        torch.testing.assert_close(grad, true_grad, rtol=0, atol=1e-6, msg=vf)


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
