"""The turns toy of benchmarks/turn_credit_bias.py: episodes of policy turns, the number of turns
the policy's choice (EOS ends the episode) or fixed (EOS ends the turn), step rewards on each turn's
last action token. Its exact gradient is checked against finite differences of J computed by a
plain loop; the project's estimators (through build_estimator, with the turn rule's segments) are
checked where the answer is known: rloo, dr_grpo and gae with exact values at turn starts are
unbiased; MT-GRPO's per-turn-index baseline is biased when the policy decides the number of turns
and exact when the number is fixed at 2 (its std division made a constant), and with 3 fixed turns
a turn is not credited with the later turns' step rewards."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import turn_credit_bias as tb  # noqa: E402
from benchmarks.credit_bias import A_TOK, B_TOK, EOS, compare  # noqa: E402

G = 3
MT_NO_STD = "mt_grpo, std division off (group_eps 1e8)"


@pytest.fixture(scope="module")
def cases():
    return tb.cases(G)


@pytest.fixture(scope="module", params=[True, False], ids=["varying_turns", "fixed_turns"])
def with_steps(request):
    tt = tb.make_turn_toy(varying=request.param, step=1.0, seed=0)
    return tt, tb.true_gradient(tt)


def test_the_episodes_and_their_turns():
    varying = tb.make_turn_toy(varying=True)
    fixed = tb.make_turn_toy(varying=False)
    # 1 turn: EOS, aEOS, bEOS; 2 turns: 4 first turns times 3 ended + 4 cut second turns
    assert varying.toy.n == 3 + 4 * (3 + 4) == 31
    assert fixed.toy.n == 7 * 7  # 2 turns, each one of 7
    for tt in (varying, fixed):
        assert float(tt.toy.probs().detach().sum()) == pytest.approx(1.0, abs=1e-12)
    assert set(varying.turn_index.amax(1).tolist()) == {1, 2}
    assert set(fixed.turn_index.amax(1).tolist()) == {2}
    # a hand-worked episode: turn (a, b), an observation, turn (EOS)
    i = [tuple(r) for r in varying.toy.ids.tolist()].index((A_TOK, B_TOK, EOS, EOS))
    assert varying.toy.mask[i].tolist() == [True, True, True, False]
    assert varying.turn_index[i].tolist() == [1, 1, 2, 0]
    assert varying.turn_end[i].tolist() == [False, True, True, False]
    # steps: 1·[starts with a] + 0.5·#b − 0.5 on each turn's last token
    assert varying.step[i].tolist() == [0.0, 1.0, -0.5, 0.0]
    assert float(varying.toy.score[i]) == pytest.approx(2.0 + 0.8)  # first a, one b, ended


def plain_J(tt: tb.TurnToy, theta: list[list[float]]) -> float:
    """J by a plain loop: each episode's probability from the softmax of its prefix's logits,
    its return from its turns (steps recomputed from the tokens) and the outcome."""
    J = 0.0
    eps = tb.episodes(2, 2, tt.varying)  # the default toy: 2 turns of 2 tokens at most
    for i, ep in enumerate(eps):
        tokens = [t for turn in ep for t in turn]
        assert tokens == tt.toy.ids[i, : len(tokens)].tolist()
        p = 1.0
        for t, tok in enumerate(tokens):
            row = theta[int(tt.toy.state[i, t])]
            p *= math.exp(row[tok]) / sum(math.exp(x) for x in row)
        steps = sum((turn[0] == A_TOK) + 0.5 * turn.count(B_TOK) - 0.5 for turn in ep)
        outcome = 2.0 * (tokens[0] == A_TOK) + 0.8 * tokens.count(B_TOK) - (tokens[-1] != EOS)
        J += p * (steps + outcome)
    return J


@pytest.mark.parametrize("varying", [True, False])
def test_the_true_gradient_matches_finite_differences(varying):
    tt = tb.make_turn_toy(varying=varying, step=1.0, seed=1)
    grad = tb.true_gradient(tt).view(-1, 3)
    theta = tt.toy.theta.detach().tolist()
    # the same prefix of actions is the same state, a different one another
    prefixes = {}
    for i in range(tt.toy.n):
        for t in range(int(tt.toy.mask[i].sum())):
            prefixes.setdefault(tuple(tt.toy.ids[i, :t].tolist()), set()).add(
                int(tt.toy.state[i, t])
            )
    assert all(len(s) == 1 for s in prefixes.values())
    assert len({next(iter(s)) for s in prefixes.values()}) == len(prefixes) == len(theta)
    h = 1e-5
    for s in range(len(theta)):
        for a in range(3):
            up = [row[:] for row in theta]
            down = [row[:] for row in theta]
            up[s][a] += h
            down[s][a] -= h
            fd = (plain_J(tt, up) - plain_J(tt, down)) / (2 * h)
            assert float(grad[s, a]) == pytest.approx(fd, abs=1e-8)


def test_rloo_and_dr_grpo_are_unbiased(with_steps, cases):
    tt, true = with_steps
    assert torch.allclose(cases["rloo"](tt), G * true, rtol=1e-9, atol=1e-12)
    assert torch.allclose(cases["dr_grpo"](tt), (G - 1) * true, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "name",
    [
        "gae, exact V, turn, start, λ=1, --no_eos_own_macro",
        "gae, exact V, turn, start, λ=0.95, --no_eos_own_macro",
        "gae, exact V, token level, λ=0.95",
    ],
)
def test_gae_with_exact_values_at_turn_starts_is_unbiased(with_steps, cases, name):
    tt, true = with_steps
    assert torch.allclose(cases[name](tt), true, rtol=1e-9, atol=1e-12)


def test_the_eos_split_off_the_last_turn_is_biased(with_steps, cases):
    tt, true = with_steps
    g = cases["gae, exact V, turn, start, λ=0.95, EOS own macro"](tt)
    assert compare("x", g, true).residual > 0.01


def test_a_per_turn_index_baseline_is_biased_only_when_the_policy_decides_the_turns(
    with_steps, cases
):
    tt, true = with_steps
    for variant in ("mean incl. self", "leave-one-out"):
        g = cases[f"per-turn-index group baseline (RFC #7244, {variant})"](tt)
        residual = compare("x", g, true).residual
        if tt.varying:
            assert residual > 0.2
        else:
            assert residual < 1e-9


def test_mt_grpo_is_biased_when_the_policy_decides_the_number_of_turns(with_steps, cases):
    tt, true = with_steps
    row = compare("x", cases[MT_NO_STD](tt), true)
    if tt.varying:
        assert row.residual > 0.03
        # an episode's further turn is compared only with the group's same turn, so its (here
        # mostly positive) step reward is under-credited: a push towards ending the episode
        assert row.eos_bias > 0.01
    else:  # two turns: the first credited with its step and the outcome, the second the outcome
        assert row.residual < 1e-6
        assert row.scale == pytest.approx((G - 1) / 1e8, rel=1e-4)
    # with its std division, a further bias (as grpo's), in both
    assert compare("x", cases["mt_grpo"](tt), true).residual > 0.03


def test_mt_grpo_credits_a_turn_without_the_later_turns_steps():
    tt = tb.make_turn_toy(K=3, T=1, varying=False, step=1.0, seed=0)
    true = tb.true_gradient(tt)
    assert compare("x", tb.cases(G)[MT_NO_STD](tt), true).residual > 0.02
    outcome_only = tb.make_turn_toy(K=3, T=1, varying=False, step=0.0, seed=0)
    g = tb.cases(G)[MT_NO_STD](outcome_only)
    assert compare("x", g, tb.true_gradient(outcome_only)).residual < 1e-6


def test_mt_grpo_s_push_follows_the_sign_of_the_step_rewards(cases):
    costs = tb.make_turn_toy(varying=True, step=-1.0, seed=0)  # each step reward made a cost
    row = compare("x", cases[MT_NO_STD](costs), tb.true_gradient(costs))
    assert row.residual > 0.1 and row.eos_bias < -0.1  # a push towards taking another turn
