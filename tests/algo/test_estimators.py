"""marlhf.algo.estimators against plain-Python loops, an enumerable toy policy and the existing GAE path."""

import doctest
import itertools
import math
import statistics

import pytest
import torch

import marlhf.algo.estimators as est
from marlhf.algo.estimators import (
    EstimatorInputs,
    EstimatorOptions,
    MCBoundaries,
    MCValues,
    build_estimator,
    macro_mc_advantages,
    resolve_estimator,
    select_mc_boundaries,
)
from marlhf.algo.kl_rewards import compose_rewards, sequence_rewards, token_rewards
from marlhf.algo.macro_gae import macro_advantages
from marlhf.macro.segments import build_segments

# ---------------------------------------------------------------- hand-built groups


def grouped_batch(G, P=3, A=7, seed=0):
    """P prompts x G samples in a shuffled row order, lengths from 1 to A (rows of length A are
    truncated at the limit), one short row per batch, NaN on padding."""
    g = torch.Generator().manual_seed(seed)
    B = P * G
    lengths = torch.randint(1, A + 1, (B,), generator=g)
    lengths[0], lengths[1] = A, 1  # a truncated row and a one-token row
    mask = torch.arange(A)[None, :] < lengths[:, None]
    group_ids = torch.arange(P).repeat_interleave(G) * 10 + 3  # arbitrary labels
    group_ids = group_ids[torch.randperm(B, generator=g)]  # groups are not contiguous
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    scores[2] = scores[3]  # ties are fine
    kl_rewards = 0.1 * torch.randn(B, A, generator=g, dtype=torch.float64)
    kl_rewards[~mask] = float("nan")
    return kl_rewards, scores, mask, group_ids


def rows_of(group_ids, b):
    return [j for j in range(len(group_ids)) if int(group_ids[j]) == int(group_ids[b])]


def loop_returns(kl_row, length, final, gamma):
    """Return-to-go over one row with `final` added on its last valid token."""
    r = [float(kl_row[t]) for t in range(length)]
    r[length - 1] += final
    out, acc = [0.0] * len(kl_row), 0.0
    for t in reversed(range(length)):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


def loop_outcome(name, scores, group_ids, b, eps=1e-6):
    members = [float(scores[j]) for j in rows_of(group_ids, b)]
    r = float(scores[b])
    if name == "grpo":
        return (r - statistics.fmean(members)) / (statistics.stdev(members) + eps)
    if name == "dr_grpo":
        return r - statistics.fmean(members)
    others = list(members)
    others.remove(r)
    return r - statistics.fmean(others)  # rloo


@pytest.mark.parametrize("G", [2, 8])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_group_estimators_match_loop(name, G, gamma):
    kl, scores, mask, group_ids = grouped_batch(G, seed=G)
    inputs = EstimatorInputs(kl, scores, mask, group_ids=group_ids)
    adv, ret = build_estimator(name, EstimatorOptions(gamma=gamma))(inputs)
    assert ret is None
    for b in range(mask.shape[0]):
        length = int(mask[b].sum())
        want = loop_returns(kl[b], length, loop_outcome(name, scores, group_ids, b), gamma)
        assert adv[b].tolist() == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("G", [2, 8])
def test_group_outcome_without_kl_is_broadcast_to_valid_tokens(G):
    _, scores, mask, group_ids = grouped_batch(G, seed=5)
    zero_kl = torch.zeros(mask.shape, dtype=torch.float64)
    adv, _ = build_estimator("grpo")(EstimatorInputs(zero_kl, scores, mask, group_ids=group_ids))
    for b in range(mask.shape[0]):
        outcome = loop_outcome("grpo", scores, group_ids, b)
        assert adv[b, mask[b]].tolist() == pytest.approx([outcome] * int(mask[b].sum()))
        assert (adv[b, ~mask[b]] == 0).all()
    # the group-normalised outcomes of each group have mean 0 and std 1 (up to eps)
    for gid in group_ids.unique():
        a = adv[group_ids == gid, 0]
        assert float(a.mean()) == pytest.approx(0.0, abs=1e-9)
        assert float(a.std()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("G", [2, 8])
@pytest.mark.parametrize("gamma", [1.0, 0.95])
def test_reinforce_pp_matches_loop(G, gamma):
    kl, scores, mask, group_ids = grouped_batch(G, seed=10 + G)
    adv, ret = build_estimator("reinforce++", EstimatorOptions(gamma=gamma))(
        EstimatorInputs(kl, scores, mask)
    )
    returns = [
        loop_returns(kl[b], int(mask[b].sum()), float(scores[b]), gamma) for b in range(len(scores))
    ]
    flat = [returns[b][t] for b in range(len(scores)) for t in range(int(mask[b].sum()))]
    mean, var = statistics.fmean(flat), statistics.variance(flat)
    for b in range(len(scores)):
        n = int(mask[b].sum())
        assert ret[b].tolist() == pytest.approx(returns[b], abs=1e-9)
        want = [(x - mean) / math.sqrt(var + 1e-8) for x in returns[b][:n]]
        assert adv[b, :n].tolist() == pytest.approx(want, abs=1e-9)
        assert (adv[b, n:] == 0).all()


def test_group_validation_messages():
    kl, scores, mask, _ = grouped_batch(2, P=2)
    for name in ("grpo", "dr_grpo", "rloo"):
        singletons = EstimatorInputs(kl, scores, mask, group_ids=torch.arange(4))
        with pytest.raises(ValueError, match="--n_samples_per_prompt to 2 or more"):
            build_estimator(name)(singletons)
        unequal = EstimatorInputs(kl, scores, mask, group_ids=torch.tensor([0, 0, 0, 1]))
        with pytest.raises(ValueError, match=r"differ in size \(group id: rows — 0: 3, 1: 1\)"):
            build_estimator(name)(unequal)
        with pytest.raises(ValueError, match="needs group ids"):
            build_estimator(name)(EstimatorInputs(kl, scores, mask))
    with pytest.raises(ValueError, match="group_ids must be"):
        EstimatorInputs(kl, scores, mask, group_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="scores must be"):
        EstimatorInputs(kl, scores[:3], mask)


def test_registry_names_aliases_and_needs():
    assert resolve_estimator("reinforce++") == "reinforce_pp"
    assert resolve_estimator("reinforce_plus_plus") == "reinforce_pp"
    assert resolve_estimator("group_norm") == "grpo"
    with pytest.raises(ValueError, match="'ppo' is not known; valid: gae, grpo, dr_grpo, rloo"):
        build_estimator("ppo")
    needs = {
        n: (e.needs_critic, e.needs_groups, e.needs_mc, e.batch_level, e.needs_segments)
        for n, e in ((n, build_estimator(n)) for n in est.ESTIMATORS)
    }
    assert needs == {
        "gae": (True, False, False, False, True),
        "grpo": (False, True, False, True, False),
        "dr_grpo": (False, True, False, True, False),
        "rloo": (False, True, False, True, False),
        "mt_grpo": (False, True, False, True, False),
        "reinforce_pp": (False, False, False, True, False),
        "macro_mc": (False, True, True, True, True),
    }
    assert build_estimator("dr_grpo").loss_agg_mode == "seq-mean-token-sum-norm"
    assert build_estimator("grpo").loss_agg_mode is None


# ---------------------------------------------------------------- gae through the registry


@pytest.mark.parametrize("value_function", ["equal", "position", "unit", "start"])
def test_gae_entry_is_bit_identical_to_the_trainers_path(value_function):
    """The score on the last token (compose_rewards), then macro_advantages: the registry's gae,
    which the trainer calls, takes the score apart and must give the same bits with
    --macro_reward_agg sum."""
    g = torch.Generator().manual_seed(3)
    B, A = 6, 9
    lengths = torch.tensor([9, 4, 1, 0, 7, 9])
    mask = torch.arange(A)[None, :] < lengths[:, None]
    macro_end = (
        (torch.rand(B, A, generator=g) < 0.4) | (torch.arange(A) == (lengths - 1)[:, None])
    ) & mask
    seg = build_segments(macro_end, mask)
    kl = torch.randn(B, A, generator=g) * mask
    raw_scores = 3 * torch.randn(B, generator=g)
    eos = torch.tensor([False, True, True, True, True, False])
    values = torch.randn(B, A, generator=g) * mask
    kw = dict(reward_clip=2.5, ends_with_eos=eos, no_eos_penalty=-0.5)
    rewards = compose_rewards(kl, raw_scores, mask, kl_coef=0.05, **kw)
    ref = macro_advantages(
        rewards, values, mask, seg, value_function=value_function, gamma=1.0, lam=0.95
    )
    inputs = EstimatorInputs(
        token_rewards(kl, mask, kl_coef=0.05),
        sequence_rewards(raw_scores, mask, **kw),
        mask,
        segments=seg,
        values=values,
    )
    opts = EstimatorOptions(gamma=1.0, lam=0.95, value_function=value_function)
    adv, ret = build_estimator("gae", opts)(inputs)
    assert torch.equal(adv, ref[0]) and torch.equal(ret, ref[1])


# ---------------------------------------------------------------- macro_mc: boundaries and the formula


def loop_macros(macro_end_row, length):
    macros, cur = [], []
    for t in range(length):
        cur.append(t)
        if macro_end_row[t]:
            macros.append(cur)
            cur = []
    return macros


def random_macro_batch(seed, B=7, A=12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, A + 1, (B,), generator=g)
    lengths[:3] = torch.tensor([A, 1, 0])
    mask = torch.arange(A)[None, :] < lengths[:, None]
    macro_end = (
        (torch.rand(B, A, generator=g) < 0.4) | (torch.arange(A) == (lengths - 1)[:, None])
    ) & mask
    return macro_end, mask, g


@pytest.mark.parametrize("C", [0, 1, 2, 3, 20])
def test_select_mc_boundaries_matches_loop(C):
    macro_end, mask, _ = random_macro_batch(C)
    b = select_mc_boundaries(build_segments(macro_end, mask), C)
    for row in range(mask.shape[0]):
        macros = loop_macros(macro_end[row].tolist(), int(mask[row].sum()))
        K = len(macros)
        ks = list(range(1, K)) if K - 1 <= C else [(i + 1) * K // (C + 1) for i in range(C)]
        assert len(set(ks)) == len(ks) and all(1 <= k <= K - 1 for k in ks)
        n = len(ks)
        assert b.mask[row].tolist() == [True] * n + [False] * (b.mask.shape[1] - n)
        assert b.positions[row, :n].tolist() == [macros[k][0] for k in ks]
        assert b.macro_index[row, :n].tolist() == ks
        assert (b.positions[row, n:] == -1).all()


def loop_macro_mc(kl_row, length, score, positions, values, v0):
    cuts = [0, *positions, length]
    vhat = [v0, *values, score]
    adv = [0.0] * len(kl_row)
    for j in range(len(cuts) - 1):
        tokens = range(cuts[j], cuts[j + 1])
        a = vhat[j + 1] - vhat[j] + sum(float(kl_row[t]) for t in tokens)
        for t in tokens:
            adv[t] = a
    return adv


@pytest.mark.parametrize("C", [0, 1, 2, 5])
def test_macro_mc_matches_loop_with_merged_macro_actions(C):
    macro_end, mask, g = random_macro_batch(100 + C)
    B, A = mask.shape
    seg = build_segments(macro_end, mask)
    bnd = select_mc_boundaries(seg, C)
    kl = 0.1 * torch.randn(B, A, generator=g, dtype=torch.float64)
    kl[~mask] = float("nan")
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    mc_values = torch.randn(bnd.positions.shape, generator=g, dtype=torch.float64)
    mc_values[~bnd.mask] = float("nan")  # padding must not leak
    v0 = torch.randn(B, generator=g, dtype=torch.float64)
    inputs = EstimatorInputs(kl, scores, mask, segments=seg, mc=MCValues(bnd, mc_values, v0))
    adv, ret = build_estimator("macro_mc")(inputs)
    assert ret is None
    for b in range(B):
        n = int(bnd.mask[b].sum())
        want = loop_macro_mc(
            kl[b], int(mask[b].sum()), float(scores[b]), bnd.positions[b, :n].tolist(),
            mc_values[b, :n].tolist(), float(v0[b]),
        )  # fmt: skip
        assert adv[b].tolist() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("G", [2, 8])
def test_macro_mc_with_one_macro_action_is_rloo(G):
    """One macro action per response: no interior boundary, V̂(s_0) = the group's leave-one-out
    mean, so the advantage is RLOO's (plus, with KL, the row's whole KL on every token)."""
    kl, scores, mask, group_ids = grouped_batch(G, seed=30 + G)
    lengths = mask.sum(1)
    seg = build_segments(mask & (torch.arange(mask.shape[1]) == (lengths - 1)[:, None]), mask)
    bnd = select_mc_boundaries(seg, 4)
    assert bnd.positions.shape[1] == 0
    zero = torch.zeros_like(kl)
    mc = MCValues(bnd, torch.zeros(len(scores), 0, dtype=torch.float64))
    adv_mc, _ = build_estimator("macro_mc")(
        EstimatorInputs(zero, scores, mask, group_ids=group_ids, mc=mc)
    )
    adv_rloo, _ = build_estimator("rloo")(EstimatorInputs(zero, scores, mask, group_ids=group_ids))
    assert torch.equal(adv_mc, adv_rloo)
    adv_kl, _ = build_estimator("macro_mc")(
        EstimatorInputs(kl, scores, mask, group_ids=group_ids, mc=mc)
    )
    total_kl = torch.where(mask, kl, 0.0).sum(1, keepdim=True)
    torch.testing.assert_close(adv_kl, torch.where(mask, adv_rloo + total_kl, 0.0))


def test_macro_mc_validation():
    macro_end, mask, _ = random_macro_batch(1)
    seg = build_segments(macro_end, mask)
    bnd = select_mc_boundaries(seg, 2)
    B = mask.shape[0]
    kl, scores = torch.zeros(mask.shape), torch.zeros(B)
    est_mc = build_estimator("macro_mc")
    with pytest.raises(ValueError, match="needs mc"):
        est_mc(EstimatorInputs(kl, scores, mask))
    with pytest.raises(ValueError, match="prompt_values, or group_ids"):
        est_mc(
            EstimatorInputs(kl, scores, mask, mc=MCValues(bnd, torch.zeros(bnd.positions.shape)))
        )
    nan = torch.full(bnd.positions.shape, float("nan"))
    with pytest.raises(ValueError, match="not finite"):
        est_mc(EstimatorInputs(kl, scores, mask, mc=MCValues(bnd, nan, torch.zeros(B))))
    bad = MCBoundaries(bnd.positions.clone(), bnd.mask, bnd.macro_index)
    bad.positions[0, 0] = int(mask[0].sum())  # outside the response
    with pytest.raises(ValueError, match="increasing positions inside the response"):
        macro_mc_advantages(kl, scores, mask, bad, torch.zeros(bnd.positions.shape), torch.zeros(B))
    with pytest.raises(ValueError, match="--gamma must be 1"):
        build_estimator("macro_mc", EstimatorOptions(gamma=0.9))(
            EstimatorInputs(
                kl, scores, mask, mc=MCValues(bnd, torch.zeros(bnd.positions.shape), torch.zeros(B))
            )
        )
    with pytest.raises(ValueError, match="mc_max_boundaries"):
        select_mc_boundaries(seg, -1)


# ---------------------------------------------------------------- macro_mc on an enumerable policy


class ToyPolicy:
    """Tabular softmax policy over a vocabulary of V tokens and L steps (the logits depend on the
    whole prefix), with a score defined on the tokens; every state value is enumerable."""

    def __init__(self, V=3, L=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.V, self.L = V, L
        self.offsets = [sum(V**j for j in range(n)) for n in range(L + 1)]
        self.probs = torch.softmax(
            1.5 * torch.randn(self.offsets[L], V, generator=g, dtype=torch.float64), -1
        )
        self.score_table = torch.rand(V**L, generator=g, dtype=torch.float64)  # R(a_0..a_{L-1})

    def index(self, prefix):  # prefix: (K, n) long -> (K,) state index
        code = torch.zeros(prefix.shape[0], dtype=torch.long)
        for j in range(prefix.shape[1]):
            code = code * self.V + prefix[:, j]
        return self.offsets[prefix.shape[1]] + code

    def score(self, seqs):  # (K, L) -> (K,)
        return self.score_table[self.index(seqs) - self.offsets[self.L]]

    def complete(self, prefix, g):  # (K, n) -> (K, L) sampled continuations
        while prefix.shape[1] < self.L:
            nxt = torch.multinomial(self.probs[self.index(prefix)], 1, generator=g)
            prefix = torch.cat([prefix, nxt], 1)
        return prefix

    def value_and_var(self, prefix):
        """Exact E[R | prefix] and Var[R | prefix] by enumerating the completions."""
        n, m1, m2 = len(prefix), 0.0, 0.0
        for rest in itertools.product(range(self.V), repeat=self.L - n):
            seq = list(prefix) + list(rest)
            p = 1.0
            for t in range(n, self.L):
                p *= float(self.probs[int(self.index(torch.tensor([seq[:t]])))][seq[t]])
            r = float(self.score(torch.tensor([seq])))
            m1, m2 = m1 + p * r, m2 + p * r * r
        return m1, m2 - m1 * m1


def mc_setup(policy, B=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    seqs = policy.complete(torch.zeros(B, 0, dtype=torch.long), g)
    mask = torch.ones(B, policy.L, dtype=torch.bool)
    macro_end = (torch.rand(B, policy.L, generator=g) < 0.5) | (
        torch.arange(policy.L) == policy.L - 1
    )
    seg = build_segments(macro_end, mask)
    return seqs, mask, seg, select_mc_boundaries(seg, 2)  # rows with 4 macro actions get merged


def mc_estimates(policy, seqs, bnd, K, g):
    """V̂ at each boundary and at the prompt from K sampled continuations each."""
    B, N = bnd.positions.shape
    values = torch.zeros(B, N, dtype=torch.float64)
    for b, n in bnd.mask.nonzero().tolist():
        prefix = seqs[b, : int(bnd.positions[b, n])].expand(K, -1)
        values[b, n] = policy.score(policy.complete(prefix, g)).mean()
    prompt = torch.stack(
        [
            policy.score(policy.complete(torch.zeros(K, 0, dtype=torch.long), g)).mean()
            for _ in range(B)
        ]
    )
    return values, prompt


def test_macro_mc_converges_to_the_true_advantages():
    policy = ToyPolicy()
    seqs, mask, seg, bnd = mc_setup(policy)
    B, L = seqs.shape
    scores = policy.score(seqs)
    kl = torch.zeros(B, L, dtype=torch.float64)
    # exact state values: V(s_0) at the prompt, V at the boundaries; V(s_K) is the score itself
    exact = torch.zeros(bnd.positions.shape, dtype=torch.float64)
    var = torch.zeros(bnd.positions.shape, dtype=torch.float64)
    for b, n in bnd.mask.nonzero().tolist():
        exact[b, n], var[b, n] = policy.value_and_var(seqs[b, : int(bnd.positions[b, n])].tolist())
    v0, var0 = policy.value_and_var([])
    v0s = torch.full((B,), v0, dtype=torch.float64)
    truth = macro_mc_advantages(kl, scores, mask, bnd, exact, v0s)
    # the true advantage V(s_{j+1}) - V(s_j), per credit segment, by a loop
    for b in range(B):
        n = int(bnd.mask[b].sum())
        want = loop_macro_mc(
            [0.0] * L, L, float(scores[b]), bnd.positions[b, :n].tolist(), exact[b, :n].tolist(), v0
        )
        assert truth[b].tolist() == pytest.approx(want, abs=1e-12)
    # the variance of each token's estimate: Var V̂(start) + Var V̂(end), each Var[R | s] / K
    var_ext = torch.cat(
        [
            torch.full((B, 1), var0, dtype=torch.float64),
            var,
            torch.zeros(B, 1, dtype=torch.float64),
        ],
        1,
    )
    n_b = bnd.mask.sum(1)
    var_ext.scatter_(1, (n_b + 1)[:, None], 0.0)
    cid = est.credit_segment_ids(bnd, mask)
    var_token = var_ext.gather(1, cid) + var_ext.gather(1, cid + 1)  # times 1/K

    g = torch.Generator().manual_seed(7)
    errors = {}
    for K in (10, 1000):
        values, prompt = mc_estimates(policy, seqs, bnd, K, g)
        adv, _ = build_estimator("macro_mc")(
            EstimatorInputs(kl, scores, mask, segments=seg, mc=MCValues(bnd, values, prompt))
        )
        err = (adv - truth).abs()
        # every estimate within 5 standard deviations of the truth (a 6e-7 chance each if Gaussian)
        assert bool((err <= 5 * (var_token / K).sqrt() + 1e-12).all()), K
        errors[K] = float(err.max())
    # sd shrinks by sqrt(100) = 10 from K = 10 to 1000; demand at least a factor 3
    assert errors[1000] < errors[10] / 3, errors
    assert errors[1000] < 5 * math.sqrt(2 * 0.25 / 1000)  # scores in [0, 1]: Var <= 1/4


def test_docstring_examples():
    assert doctest.testmod(est).failed == 0


# ---------------------------------------------------------------- multi-turn: per-turn rewards


def _turn_batch(seed: int = 0, B: int = 8, G: int = 4):
    """Rows of 1 to 4 turns of 1 to 3 tokens each (compacted actions), per-turn rewards on each
    turn's last token, groups of G rows not adjacent."""
    g = torch.Generator().manual_seed(seed)
    turns = [[int(n) for n in torch.randint(1, 4, (int(k),), generator=g)]
             for k in torch.randint(1, 5, (B,), generator=g)]  # fmt: skip
    A = max(sum(t) for t in turns)
    mask = torch.zeros(B, A, dtype=torch.bool)
    end = torch.zeros(B, A, dtype=torch.bool)
    index = torch.zeros(B, A, dtype=torch.long)
    rewards = torch.zeros(B, A, dtype=torch.float64)
    for b, lengths in enumerate(turns):
        t = 0
        for k, n in enumerate(lengths, start=1):
            mask[b, t : t + n] = True
            index[b, t : t + n] = k
            t += n
            end[b, t - 1] = True
            rewards[b, t - 1] = float(torch.randint(0, 3, (), generator=g)) / 2
    kl = torch.randn(B, A, generator=g, dtype=torch.float64) * 0.1 * mask
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    groups = torch.arange(B) % (B // G)
    return turns, mask, end, index, rewards, kl, scores, groups


def _mt_grpo_loop(turns, rewards, end, scores, groups, eps=1e-6):
    """MT-GRPO by a plain loop: (B, A) advantages without the KL part."""
    B = len(turns)
    per_row = []  # each row's rewards per turn, in order
    for b in range(B):
        per_row.append([float(rewards[b, t]) for t in range(end.shape[1]) if end[b, t]])
    outcome = [float(scores[b]) + per_row[b][-1] for b in range(B)]

    def norm(x, pool):
        m = sum(pool) / len(pool)
        sd = math.sqrt(sum((p - m) ** 2 for p in pool) / (len(pool) - 1))
        return (x - m) / (sd + eps)

    out = torch.zeros(end.shape, dtype=torch.float64)
    for b in range(B):
        mates = [j for j in range(B) if groups[j] == groups[b]]
        a_o = norm(outcome[b], [outcome[j] for j in mates])
        t = 0
        for k, n in enumerate(turns[b]):
            a = a_o
            if k < len(turns[b]) - 1:  # an intermediate turn: its reward against the group's
                pool = [per_row[j][k] for j in mates if k < len(turns[j]) - 1]
                a += norm(per_row[b][k], pool) if len(pool) >= 2 else 0.0
            out[b, t : t + n] = a
            t += n
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_mt_grpo_matches_a_loop_over_groups_and_turns(seed, gamma):
    turns, mask, end, index, rewards, kl, scores, groups = _turn_batch(seed)
    inputs = EstimatorInputs(kl_rewards=kl, scores=scores, action_mask=mask, group_ids=groups)
    inputs = est.with_turn_rewards(inputs, "own", rewards, end, index)
    adv, ret = build_estimator("mt_grpo", EstimatorOptions(gamma=gamma))(inputs)
    want = _mt_grpo_loop(turns, rewards, end, scores, groups)
    for b in range(len(turns)):  # plus the discounted return-to-go of the KL rewards
        n, future = int(mask[b].sum()), 0.0
        for t in reversed(range(n)):
            future = float(kl[b, t]) + gamma * future
            want[b, t] += future
    assert ret is None
    assert torch.allclose(adv, want, atol=1e-9)
    assert (adv[~mask] == 0).all()


def test_turn_rewards_join_the_tokens_or_the_outcome_as_each_estimator_says():
    turns, mask, end, index, rewards, kl, scores, groups = _turn_batch(1)
    base = EstimatorInputs(
        kl_rewards=kl, scores=scores, action_mask=mask, group_ids=groups,
        segments=build_segments(end, mask), values=torch.zeros_like(kl),
    )  # fmt: skip
    # gae and reinforce_pp: on each turn's last token, as if the KL rewards had them
    as_tokens = EstimatorInputs(
        kl_rewards=kl + rewards, scores=scores, action_mask=mask, group_ids=groups,
        segments=base.segments, values=base.values,
    )  # fmt: skip
    # grpo, dr_grpo, rloo: the episode's total reward
    as_outcome = EstimatorInputs(
        kl_rewards=kl, scores=scores + rewards.sum(1), action_mask=mask, group_ids=groups
    )
    for name, want in [
        ("gae", as_tokens), ("reinforce_pp", as_tokens), ("grpo", as_outcome),
        ("dr_grpo", as_outcome), ("rloo", as_outcome),
    ]:  # fmt: skip
        how = est.estimator_class(name).turn_rewards
        got = build_estimator(name)(est.with_turn_rewards(base, how, rewards, end, index))[0]
        assert torch.equal(got, build_estimator(name)(want)[0]), name
    with pytest.raises(ValueError, match="mt_grpo needs turn_rewards"):
        build_estimator("mt_grpo")(base)
