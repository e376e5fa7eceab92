"""The enumerable toy of benchmarks/credit_bias.py: the policy decides how many macro actions a
response has, every response (and every group of G = 3) is enumerated, and each estimator's expected
update is compared with the exact gradient of J. A per-index group baseline (verl RFC #7244) is
biased; this project's estimators are not where they claim to be (rloo, dr_grpo without per-token
rewards, gae with exact values and the `start` weighting, macro_mc with spaced boundaries, lowprob
cutting after the low-probability token); the choices that are biased are shown to be."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import credit_bias as cb  # noqa: E402

G = 3


@pytest.fixture(scope="module", params=[True, False], ids=["with_kl", "outcome_only"])
def toy_and_cases(request):
    toy = cb.make_toy(seed=0, kl=request.param)
    return toy, cb.true_gradient(toy), cb.cases(G), request.param


def expected(toy_and_cases, name):
    toy, true, cases, _ = toy_and_cases
    return cases[name](toy), true


def test_the_toy_is_a_distribution_with_varying_macro_counts():
    toy = cb.make_toy()
    assert toy.n == 31 and float(toy.probs().detach().sum()) == pytest.approx(1.0, abs=1e-12)
    assert set(toy.mask.sum(1).tolist()) == {1, 2, 3, 4}
    # exact values by a loop over the responses through each prefix
    V = toy.values()
    p = toy.probs().detach()
    i, t = 20, 2
    same = [j for j in range(toy.n) if toy.mask[j, t] and toy.state[j, t] == toy.state[i, t]]
    future = [float(toy.kl[j, t:].sum() + toy.score[j]) for j in same]
    ref = sum(float(p[j]) * f for j, f in zip(same, future, strict=True)) / sum(
        float(p[j]) for j in same
    )
    assert float(V[i, t]) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("variant", ["mean incl. self", "leave-one-out"])
def test_a_per_index_group_baseline_is_biased(toy_and_cases, variant):
    g, true = expected(toy_and_cases, f"per-index group baseline (RFC #7244, {variant})")
    row = cb.compare("x", g, true)
    assert row.residual > 0.3  # far from any multiple of the gradient
    assert abs(row.eos_bias) > 0.3  # mostly on the decision to stop


def test_rloo_is_unbiased(toy_and_cases):
    g, true = expected(toy_and_cases, "rloo")
    assert torch.allclose(g, G * true, rtol=1e-9, atol=1e-12)  # G rows per group


def test_dr_grpo_is_unbiased_up_to_scale_without_per_token_rewards(toy_and_cases):
    g, true = expected(toy_and_cases, "dr_grpo")
    if not toy_and_cases[3]:
        assert torch.allclose(g, (G - 1) * true, rtol=1e-9, atol=1e-12)  # G (1 - 1/G)
    else:  # the group mean includes the row itself: only the outcome part shrinks by 1 - 1/G
        assert cb.compare("x", g, true).residual > 0.05


@pytest.mark.parametrize(
    "name",
    [
        "gae, exact V, start, λ=1, n=1",
        "gae, exact V, start, λ=0.95, n=2, no EOS split",
        "gae, exact V, start, lowprob cut after",
    ],
)
def test_gae_with_exact_values_and_stopping_time_starts_is_unbiased(toy_and_cases, name):
    g, true = expected(toy_and_cases, name)
    assert torch.allclose(g, true, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "name",
    [
        "gae, exact V, start, lowprob cut before",  # a start that depends on its own token
        "gae, exact V, start, λ=0.95, n=2, EOS own macro",  # the EOS macro starts at the stop
        "gae, exact V, equal, λ=0.95, n=2, no EOS split",  # values after the macro's own tokens
        "gae, exact V, start, n=2, --macro_credit boundary",  # drops the other tokens' terms
    ],
)
def test_action_dependent_starts_and_baselines_are_biased(toy_and_cases, name):
    g, true = expected(toy_and_cases, name)
    assert cb.compare("x", g, true).residual > 0.05


def test_macro_mc_spaced_boundaries_are_unbiased_and_spread_ones_are_not(toy_and_cases):
    spaced, true = expected(toy_and_cases, "macro_mc, exact V̂, spaced boundaries (C=1)")
    spread, _ = expected(toy_and_cases, "macro_mc, exact V̂, spread boundaries (C=1)")
    assert cb.compare("x", spread, true).residual > 0.05
    if not toy_and_cases[3]:
        assert torch.allclose(spaced, true, rtol=1e-9, atol=1e-12)
    else:  # macro_mc credits a segment with its own tokens' KL rewards only (by design)
        assert cb.compare("x", spaced, true).residual > 0.05
