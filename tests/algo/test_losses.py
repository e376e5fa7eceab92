"""Tests for marlhf.algo.losses against per-token / per-macro loops and hand-worked clipping cases."""

import doctest
import math
import statistics

import pytest
import torch

import marlhf.algo.losses as losses_mod
from marlhf.algo.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_bonus,
    explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    policy_terms,
    value_loss,
)


def _batch(seed, B=4, A=9, lengths=(9, 4, 1, 6)):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(A).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    old = -torch.rand(B, A, generator=g) * 3
    logp = old + 0.3 * torch.randn(B, A, generator=g)
    adv = torch.randn(B, A, generator=g)
    return logp, old, adv, mask, g


def _random_segments(mask, g, max_len=3):
    B, A = mask.shape
    ids = torch.full((B, A), -1)
    for b in range(B):
        length, k, t = int(mask[b].sum()), 0, 0
        while t < length:
            n = int(torch.randint(1, max_len + 1, (1,), generator=g))
            ids[b, t : min(length, t + n)] = k
            t, k = t + n, k + 1
    return ids


# ---------------------------------------------------------------- masked statistics


def test_masked_mean_var_whiten_match_loops():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    vals = [float(x[b, t]) for b in range(3) for t in range(5) if mask[b, t]]
    assert masked_mean(x, mask).item() == pytest.approx(statistics.fmean(vals), abs=1e-6)
    assert masked_var(x, mask).item() == pytest.approx(statistics.variance(vals), abs=1e-5)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(
        statistics.pvariance(vals), abs=1e-5
    )
    rows = masked_mean(x, mask, dim=1)
    for b in range(3):
        row = [float(x[b, t]) for t in range(5) if mask[b, t]]
        assert rows[b].item() == pytest.approx(statistics.fmean(row), abs=1e-6)

    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(w, mask).item() == pytest.approx(1.0, abs=1e-5)
    assert torch.all(w[~mask] == 0)
    w2 = masked_whiten(x, mask, shift_mean=False)
    assert masked_mean(w2, mask).item() == pytest.approx(statistics.fmean(vals), abs=1e-5)


def test_masked_mean_ignores_nan_in_padding_and_empty_is_zero():
    x = torch.tensor([[1.0, float("nan")], [float("inf"), 3.0]])
    mask = torch.tensor([[True, False], [False, True]])
    assert masked_mean(x, mask).item() == 2.0
    assert masked_mean(x, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0


# ---------------------------------------------------------------- policy loss, token level


def _reference_token_policy_loss(logp, old, adv, mask, eps):
    terms, clipped, kls = [], [], []
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                continue
            r = torch.exp(logp[b, t] - old[b, t])
            a = adv[b, t]
            un, cl = -a * r, -a * torch.clamp(r, 1 - eps, 1 + eps)
            terms.append(torch.maximum(un, cl))
            clipped.append(float(cl > un))
            kls.append(float((r - 1 - torch.log(r)).detach()))
    return torch.stack(terms).mean(), statistics.fmean(clipped), statistics.fmean(kls)


def test_token_policy_loss_matches_loop_including_gradient():
    logp, old, adv, mask, _ = _batch(1)
    x = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(x, old, adv, mask, cliprange=0.2)
    loss.backward()
    y = logp.clone().requires_grad_(True)
    ref, ref_clipfrac, ref_kl = _reference_token_policy_loss(y, old, adv, mask, 0.2)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(x.grad, y.grad)
    assert stats["policy/clipfrac"].item() == pytest.approx(ref_clipfrac)
    assert stats["policy/approx_kl"].item() == pytest.approx(ref_kl, abs=1e-6)
    assert 0.0 < ref_clipfrac < 1.0  # the batch exercises both branches


@pytest.mark.parametrize(
    "ratio, adv, expected_term, is_clipped, has_grad",
    [
        (1.5, 1.0, -1.2, True, False),  # above range, A > 0: gain capped at 1 + eps
        (1.5, -1.0, 1.5, False, True),  # above range, A < 0: pessimistic, unclipped
        (0.5, 1.0, -0.5, False, True),  # below range, A > 0: unclipped
        (0.5, -1.0, 0.8, True, False),  # below range, A < 0: capped at 1 - eps
        (1.1, 2.0, -2.2, False, True),  # inside the range: plain ratio * A
    ],
)
def test_clipping_cases_by_hand(ratio, adv, expected_term, is_clipped, has_grad):
    logp = torch.tensor([[torch.log(torch.tensor(ratio)).item(), 0.0]], requires_grad=True)
    mask = torch.tensor([[True, False]])
    loss, stats = policy_loss(
        logp, torch.zeros(1, 2), torch.tensor([[adv, 5.0]]), mask, cliprange=0.2
    )
    assert loss.item() == pytest.approx(expected_term, abs=1e-6)
    assert stats["policy/clipfrac"].item() == float(is_clipped)
    loss.backward()
    grad = logp.grad[0, 0].item()
    if has_grad:  # d(-A r)/d logp = -A r
        assert grad == pytest.approx(-adv * ratio, abs=1e-6)
    else:
        assert grad == 0.0
    assert logp.grad[0, 1].item() == 0.0  # padding never gets gradient


# ---------------------------------------------------------------- policy loss, macro level


def test_macro_level_with_one_token_macros_equals_token_level_exactly():
    logp, old, adv, mask, _ = _batch(2)
    ids = torch.where(mask, torch.arange(mask.shape[1]).expand_as(mask), -1)
    x1 = logp.clone().requires_grad_(True)
    x2 = logp.clone().requires_grad_(True)
    l1, s1 = policy_loss(x1, old, adv, mask, cliprange=0.2)
    l2, s2 = policy_loss(x2, old, adv, mask, cliprange=0.2, ratio_level="macro", segment_ids=ids)
    l1.backward()
    l2.backward()
    assert torch.equal(l1, l2)
    assert torch.equal(x1.grad, x2.grad)
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k


def _reference_macro_policy_loss(logp, old, adv, ids, eps):
    terms, clipped, ratios = [], [], []
    for b in range(ids.shape[0]):
        groups = {}
        for t in range(ids.shape[1]):
            if ids[b, t] >= 0:
                groups.setdefault(int(ids[b, t]), []).append(t)
        for ts in groups.values():
            r = torch.exp(sum(logp[b, t] - old[b, t] for t in ts))  # Eq. 3: product of token ratios
            a = adv[b, ts[0]]
            un, cl = -a * r, -a * torch.clamp(r, 1 - eps, 1 + eps)
            terms.append(torch.maximum(un, cl))
            clipped.append(float(cl > un))
            ratios.append(float(r.detach()))
    return torch.stack(terms).mean(), statistics.fmean(clipped), statistics.fmean(ratios)


def test_macro_level_multi_token_matches_loop_including_gradient():
    logp, old, _, mask, g = _batch(3)
    ids = _random_segments(mask, g)
    # Macro advantages are shared by all tokens of a macro action (as macro GAE broadcasts them).
    macro_adv = torch.randn(mask.shape[0], mask.shape[1], generator=g)
    adv = torch.where(ids >= 0, macro_adv.gather(1, ids.clamp(min=0)), 0.0)
    x = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(
        x, old, adv, mask, cliprange=0.2, ratio_level="macro", segment_ids=ids
    )
    loss.backward()
    y = logp.clone().requires_grad_(True)
    ref, ref_clipfrac, ref_ratio = _reference_macro_policy_loss(y, old, adv, ids, 0.2)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(x.grad, y.grad)
    assert stats["policy/clipfrac"].item() == pytest.approx(ref_clipfrac)
    assert stats["policy/ratio_mean"].item() == pytest.approx(ref_ratio, rel=1e-5)
    assert 0.0 < ref_clipfrac < 1.0


def test_macro_ratio_is_product_of_token_ratios_hand_example():
    # One macro action of two tokens with ratios 1.1 and 1.2: rho = 1.32 > 1.2, A = 1 -> clipped, -1.2.
    logp = torch.log(torch.tensor([[1.1, 1.2, 1.0]]))
    mask = torch.tensor([[True, True, False]])
    ids = torch.tensor([[0, 0, -1]])
    adv = torch.tensor([[1.0, 1.0, 0.0]])
    tok, _ = policy_loss(logp, torch.zeros(1, 3), adv, mask, cliprange=0.2)
    mac, stats = policy_loss(
        logp, torch.zeros(1, 3), adv, mask, cliprange=0.2, ratio_level="macro", segment_ids=ids
    )
    assert tok.item() == pytest.approx(-1.15)  # token level: neither token clipped
    assert mac.item() == pytest.approx(-1.2)
    assert stats["policy/clipfrac"].item() == 1.0
    assert stats["policy/ratio_mean"].item() == pytest.approx(1.32)


def test_policy_loss_validation():
    z = torch.zeros(1, 2)
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="segment_ids"):
        policy_loss(z, z, z, m, cliprange=0.2, ratio_level="macro")
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(z, z, z, m, cliprange=0.2, ratio_level="episode")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(z, z, torch.zeros(1, 3), m, cliprange=0.2)


# ---------------------------------------------------------------- value loss and diagnostics


def test_value_loss_matches_loop():
    g = torch.Generator().manual_seed(4)
    B, A = 3, 6
    mask = torch.arange(A).unsqueeze(0) < torch.tensor([[6], [2], [4]])
    old = torch.randn(B, A, generator=g)
    values = old + 0.5 * torch.randn(B, A, generator=g)
    returns = torch.randn(B, A, generator=g)
    x = values.clone().requires_grad_(True)
    loss, stats = value_loss(x, old, returns, mask, cliprange_value=0.2)
    loss.backward()
    y = values.clone().requires_grad_(True)
    terms, clipped = [], []
    for b in range(B):
        for t in range(A):
            if mask[b, t]:
                vc = old[b, t] + torch.clamp(y[b, t] - old[b, t], -0.2, 0.2)
                e1, e2 = (y[b, t] - returns[b, t]) ** 2, (vc - returns[b, t]) ** 2
                terms.append(torch.maximum(e1, e2))
                clipped.append(float(e2 > e1))
    ref = 0.5 * torch.stack(terms).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(x.grad, y.grad)
    assert stats["value/clipfrac"].item() == pytest.approx(statistics.fmean(clipped))


def test_explained_variance():
    mask = torch.tensor([[True, True, True, False]])
    ret = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    const = torch.full((1, 4), 2.0)
    assert explained_variance(const, ret, mask) == pytest.approx(0.0)
    v = torch.tensor([[1.5, 2.0, 2.5, 0.0]])  # residuals -0.5, 0, 0.5: var 0.25 vs var(R) = 1
    assert explained_variance(v, ret, mask) == pytest.approx(0.75)
    assert explained_variance(v, const, mask) != explained_variance(v, const, mask)  # NaN


def test_entropy_bonus_is_masked_mean():
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 8.0, 8.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert entropy_bonus(ent, mask).item() == pytest.approx(2.5)


# ---------------------------------------------------------------- a minibatch split over ranks


def test_policy_terms_counts_tokens_or_macro_actions():
    logp, old, adv, mask, g = _batch(7)  # lengths 9, 4, 1, 6
    ids = _random_segments(mask, g)
    assert int(policy_terms(mask, "token").sum()) == 20
    # one term per macro action: the number of distinct ids of each row, counted by a loop
    want = sum(len({int(i) for i in row if i >= 0}) for row in ids)
    assert int(policy_terms(mask, "macro", ids).sum()) == want
    with pytest.raises(ValueError, match="segment_ids"):
        policy_terms(mask, "macro")


@pytest.mark.parametrize("level", ["token", "macro"])
def test_shares_of_a_split_minibatch_sum_to_its_losses_and_gradients(level):
    """Rows split over two "ranks", each dividing by the whole minibatch's counts: the shares of
    the losses, stats and gradients sum to the unsplit values (the ranks hold unequal token counts,
    so per-part means would not)."""
    logp, old, adv, mask, g = _batch(8)  # lengths 9, 4, 1, 6: parts hold 13 and 7 tokens
    ids = _random_segments(mask, g)
    values, ret, ent = torch.randn(3, 4, 9, generator=g)
    n_terms = policy_terms(mask, level, ids).sum()
    n_tokens = mask.sum()

    def losses(rows, **counts):
        x = logp[rows].clone().requires_grad_(True)
        v = values[rows].clone().requires_grad_(True)
        pg, pstats = policy_loss(
            x, old[rows], adv[rows], mask[rows], cliprange=0.2, ratio_level=level,
            segment_ids=ids[rows], **counts,
        )  # fmt: skip
        vcounts = {"num_tokens": counts["num_tokens"]} if counts else {}
        vl, vstats = value_loss(
            v, values[rows] * 0.9, ret[rows], mask[rows], cliprange_value=0.2, **vcounts
        )
        eb = entropy_bonus(ent[rows], mask[rows], **vcounts)
        (pg + vl).backward()
        return [pg, vl, eb, *pstats.values(), *vstats.values()], x.grad, v.grad

    whole, gx, gv = losses(torch.arange(4))
    counts = {"num_terms": n_terms, "num_tokens": n_tokens}
    part0, gx0, gv0 = losses(torch.tensor([0, 1]), **counts)
    part1, gx1, gv1 = losses(torch.tensor([2, 3]), **counts)
    for w, a, b in zip(whole, part0, part1, strict=True):
        torch.testing.assert_close(a + b, w)
    torch.testing.assert_close(torch.cat([gx0, gx1]), gx)
    torch.testing.assert_close(torch.cat([gv0, gv1]), gv)
    # per-part means (the split-dependent alternative) do not add up to the minibatch's
    mean0, _, _ = losses(torch.tensor([0, 1]))
    mean1, _, _ = losses(torch.tensor([2, 3]))
    assert abs(float((mean0[1] + mean1[1]).detach() / 2 - whole[1].detach())) > 1e-3


# ---------------------------------------------------------------- sequence ratio level (GSPO)


def _reference_gspo_loss(logp, old, adv, mask, eps):
    """GSPO's objective as written (Zheng et al. 2025), a loop over sequences:
    s_i = exp(mean_t log(pi / pi_old)), loss = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps, 1 + eps))."""
    terms, clipped, ratios = [], [], []
    for b in range(mask.shape[0]):
        ts = [t for t in range(mask.shape[1]) if mask[b, t]]
        if not ts:
            continue
        s = torch.exp(sum(logp[b, t] - old[b, t] for t in ts) / len(ts))
        a = adv[b, ts[0]]
        un, cl = -a * s, -a * torch.clamp(s, 1 - eps, 1 + eps)
        terms.append(torch.maximum(un, cl))
        clipped.append(float(cl > un))
        ratios.append(float(s.detach()))
    return torch.stack(terms).mean(), clipped, ratios


def test_sequence_level_matches_the_gspo_formula_including_gradient():
    logp, old, _, mask, g = _batch(4, lengths=(9, 4, 1, 6))
    logp = old + 0.2 * torch.randn(old.shape, generator=g)  # some sequences clip, some do not
    seq_adv = torch.randn(mask.shape[0], generator=g)
    adv = torch.where(mask, seq_adv[:, None], 0.0)  # one advantage per sequence
    eps = 0.05
    x = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(
        x,
        old,
        adv,
        mask,
        cliprange=eps,
        ratio_level="sequence",
        loss_agg_mode="seq-mean-token-mean",
    )
    loss.backward()
    y = logp.clone().requires_grad_(True)
    ref, clipped, ratios = _reference_gspo_loss(y, old, adv, mask, eps)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(x.grad, y.grad)
    assert 0 < sum(clipped) < len(clipped)  # both branches exercised
    # the stats are over the terms (tokens): each sequence's clip decision and ratio, token-weighted
    n = mask.sum(1).tolist()
    assert stats["policy/clipfrac"].item() == pytest.approx(
        sum(c * k for c, k in zip(clipped, n, strict=True)) / sum(n)
    )
    assert stats["policy/ratio_mean"].item() == pytest.approx(
        sum(r * k for r, k in zip(ratios, n, strict=True)) / sum(n), rel=1e-6
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_one_token_responses_all_ratio_levels_agree_exactly(mode):
    logp, old, adv, mask, _ = _batch(5, lengths=(1, 1, 0, 1))
    ids = torch.where(mask, 0, -1)
    out = []
    for level in ("token", "macro", "sequence"):
        x = logp.clone().requires_grad_(True)
        loss, stats = policy_loss(
            x, old, adv, mask, cliprange=0.2, ratio_level=level, segment_ids=ids,
            loss_agg_mode=mode, norm_length=9,
        )  # fmt: skip
        loss.backward()
        out.append((loss, x.grad, stats))
    for loss, grad, stats in out[1:]:
        assert torch.equal(loss, out[0][0]) and torch.equal(grad, out[0][1])
        for k in stats:
            assert torch.equal(stats[k], out[0][2][k]), k


def test_policy_terms_sequence_level_is_every_token():
    _, _, _, mask, _ = _batch(0)
    assert torch.equal(policy_terms(mask, "sequence"), mask)


# ---------------------------------------------------------------- loss aggregation modes


def _reference_agg(terms, weight, mode, norm_length):
    """The modes as plain loops over sequences (verl's names; Dr. GRPO's constant normaliser)."""
    rows = [
        [float(terms[b, t]) for t in range(terms.shape[1]) if weight[b, t]]
        for b in range(terms.shape[0])
    ]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        return statistics.fmean([x for r in rows for x in r])
    if mode == "seq-mean-token-sum":
        return statistics.fmean([sum(r) for r in rows])
    if mode == "seq-mean-token-mean":
        return statistics.fmean([statistics.fmean(r) for r in rows])
    return statistics.fmean([sum(r) / norm_length for r in rows])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("level", ["token", "macro", "sequence"])
def test_policy_and_value_loss_agg_modes_match_loop(mode, level):
    logp, old, adv, mask, g = _batch(6, B=5, lengths=(9, 4, 0, 1, 6))
    ids = _random_segments(mask, g)
    loss, _ = policy_loss(
        logp, old, adv, mask, cliprange=0.2, ratio_level=level, segment_ids=ids,
        loss_agg_mode=mode, norm_length=12,
    )  # fmt: skip
    # the per-term values at the chosen level, from the token-mean loss's own definition
    if level == "token":
        terms = torch.maximum(-adv * (logp - old).exp(), -adv * (logp - old).exp().clamp(0.8, 1.2))
        weight = mask
    else:
        weight = policy_terms(mask, level, ids)
        terms = torch.zeros(mask.shape)
        for b in range(mask.shape[0]):
            for t in range(mask.shape[1]):
                if not weight[b, t]:
                    continue
                if level == "macro":
                    ts = [u for u in range(mask.shape[1]) if ids[b, u] == ids[b, t]]
                else:
                    ts = [u for u in range(mask.shape[1]) if mask[b, u]]
                lr = sum(float(logp[b, u] - old[b, u]) for u in ts)
                r = math.exp(lr / (len(ts) if level == "sequence" else 1))
                a = float(adv[b, t] if level == "sequence" else adv[b, ts[0]])
                terms[b, t] = max(-a * r, -a * min(max(r, 0.8), 1.2))
    assert loss.item() == pytest.approx(_reference_agg(terms, weight, mode, 12), rel=1e-5)

    values, ret = torch.randn(2, *mask.shape, generator=g)
    vl, _ = value_loss(
        values, values * 0.9, ret, mask, cliprange_value=0.05, loss_agg_mode=mode, norm_length=12
    )
    err = torch.maximum(
        (values - ret).square(),
        (values * 0.9 + (values * 0.1).clamp(-0.05, 0.05) - ret).square(),
    )
    assert vl.item() == pytest.approx(0.5 * _reference_agg(err, mask, mode, 12), rel=1e-5)


def test_token_mean_default_is_todays_formula_bit_for_bit():
    logp, old, adv, mask, _ = _batch(9)
    ratio = (torch.where(mask, logp - old, 0.0)).exp()
    terms = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    want = torch.where(mask, terms, 0.0).sum() / mask.sum()
    assert torch.equal(policy_loss(logp, old, adv, mask, cliprange=0.2)[0], want)
    assert torch.equal(agg_loss(terms, mask), want)


def test_agg_validation():
    x, w = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="--loss_agg_mode must be one of"):
        agg_loss(x, w, "seq-sum")
    with pytest.raises(ValueError, match="--max_answer_seq_len"):
        agg_loss(x, w, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("level", ["token", "macro", "sequence"])
def test_every_agg_mode_split_over_ranks_sums_to_the_whole(mode, level):
    """The minibatch's loss (policy and value) equals the sum of its parts' losses, each computed
    with the global normalisers (terms, sequences, the constant length)."""
    logp, old, adv, mask, g = _batch(10, B=6, A=9, lengths=(9, 4, 0, 1, 6, 3))
    ids = _random_segments(mask, g)
    values, ret = torch.randn(2, 6, 9, generator=g)
    terms = policy_terms(mask, level, ids)
    norms = {"num_terms": terms.sum(), "num_seqs": terms.any(1).sum(), "norm_length": 9}
    vnorms = {"num_tokens": mask.sum(), "num_seqs": mask.any(1).sum(), "norm_length": 9}

    def losses(rows, use_global):
        x = logp[rows].clone().requires_grad_(True)
        v = values[rows].clone().requires_grad_(True)
        pn = norms if use_global else {"norm_length": 9}
        vn = vnorms if use_global else {"norm_length": 9}
        pg, _ = policy_loss(
            x, old[rows], adv[rows], mask[rows], cliprange=0.2, ratio_level=level,
            segment_ids=ids[rows], loss_agg_mode=mode, **pn,
        )  # fmt: skip
        vl, _ = value_loss(
            v, values[rows] * 0.9, ret[rows], mask[rows], cliprange_value=0.2,
            loss_agg_mode=mode, **vn,
        )  # fmt: skip
        (pg + vl).backward()
        return pg.detach(), vl.detach(), x.grad, v.grad

    whole = losses(torch.arange(6), use_global=False)
    part0 = losses(torch.tensor([0, 1, 2]), use_global=True)  # 13 tokens, 2 non-empty rows
    part1 = losses(torch.tensor([3, 4, 5]), use_global=True)  # 10 tokens, 3 rows
    for i in (0, 1):
        torch.testing.assert_close(part0[i] + part1[i], whole[i])
    for i in (2, 3):
        torch.testing.assert_close(torch.cat([part0[i], part1[i]]), whole[i])


def test_docstring_examples():
    assert doctest.testmod(losses_mod).failed == 0
