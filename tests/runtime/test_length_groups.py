"""Rows grouped by length: the partition is the least padded one over *all* partitions
(enumerated, not only the contiguous ones the dynamic programme searches), and the grouped forward
passes of scoring and training give the one-pass outputs and gradients."""

from __future__ import annotations

import doctest
import itertools

import pytest
import torch

from marlhf.models.sequences import pack_flush_left, response_mask
from marlhf.runtime import length_groups as lg
from marlhf.stages.ppo.forward import critic_forward, policy_forward, reward_forward
from marlhf.stages.ppo.rollout import Rollout, sequence_lengths
from tests.support.engine_stub import Engine


def test_doctests():
    assert doctest.testmod(lg).failed == 0


def _partitions(items):
    """Every set partition of ``items`` (a list)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first, *part[i]]] + part[i + 1 :]
        yield [[first], *part]


def _area(lengths, groups) -> int:
    return sum(len(g) * max(lengths[i] for i in g) for g in groups)


@pytest.mark.parametrize("seed", range(12))
def test_least_padded_area_over_all_partitions(seed):
    g = torch.Generator().manual_seed(seed)
    B = 1 + seed % 7
    lengths = torch.randint(1, 12, (B,), generator=g)
    L = lengths.tolist()
    parts = list(_partitions(list(range(B))))
    for K, C in itertools.product((1, 2, 3, 4), (0, 3, 10)):

        def cost(p, C=C):
            return _area(L, p) + C * len(p)

        groups = lg.length_groups(lengths, K, call_tokens=C)
        got = [x.tolist() for x in groups]
        assert sorted(itertools.chain(*got)) == list(range(B))  # a partition of the rows
        assert all(got) and len(got) <= K
        best = min(cost(p) for p in parts if len(p) <= K)
        assert cost(got) == best, (L, K, C, got)
        # the fewest groups at that cost
        fewest = min(len(p) for p in parts if len(p) <= K and cost(p) == best)
        assert len(got) == fewest, (L, K, C, got)
        # shortest first, each group sorted
        flat = [L[i] for i in itertools.chain(*got)]
        assert flat == sorted(flat)


def test_equal_lengths_stay_one_group():
    assert len(lg.length_groups(torch.full((9,), 40), 4)) == 1
    with pytest.raises(ValueError, match="max_groups"):
        lg.length_groups(torch.tensor([1, 2]), 0)
    with pytest.raises(ValueError, match="call_tokens"):
        lg.length_groups(torch.tensor([1, 2]), 2, call_tokens=-1)
    # a split that saves less than a pass costs is not taken
    assert len(lg.length_groups(torch.tensor([10, 10, 20, 20]), 2, call_tokens=19)) == 2
    assert len(lg.length_groups(torch.tensor([10, 10, 20, 20]), 2, call_tokens=20)) == 1


def test_grouped_reassembles_rows_and_pads_with_zero():
    lengths = torch.tensor([3, 9, 4, 8])

    def forward(rows):
        W = int(lengths[rows].max())
        x = rows[:, None].float() + torch.arange(W)[None, :] / 100  # row id . position
        x = x * (torch.arange(W)[None, :] < lengths[rows][:, None])  # 0 past a row's length
        return x, None, x[..., None].expand(-1, -1, 2)

    one, none, three = lg.grouped(forward, lengths, (9, 9, 9), lg.Grouping(2))
    ref = forward(torch.arange(4))
    assert none is None
    assert torch.equal(one, ref[0]) and torch.equal(three, ref[2])
    single = lg.grouped(lambda rows: forward(rows)[0], lengths, 9, lg.Grouping(3))
    assert torch.equal(single, ref[0])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import RewardModel
    from marlhf.models.zoo import build_tiny

    path = build_tiny(tmp_path_factory.mktemp("tiny") / "actor")
    torch.manual_seed(0)
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    critic = RewardModel.from_pretrained(path, init_std=0.5)
    return Engine(actor), Engine(critic)


def _rollout(B=7, P=30, A=12, seed=0):
    """Rows of very different lengths: prompts of 4..30 tokens, responses of 1..12."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, 200, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    response = torch.randint(5, 200, (B, A), generator=g)
    for b in range(B):
        prompt_mask[b, : (b * 11) % (P - 3)] = 0
        response[b, (b * 5) % A] = 2  # an EOS
    mask, ends = response_mask(response, eos_ids=[2])
    seq, att, start = pack_flush_left(prompt, prompt_mask * 1, response, mask, pad_id=0)
    return Rollout(seq, att, start, response, mask, ends, [str(b) for b in range(B)])


def test_the_rollout_splits():
    ro = _rollout()
    assert len(lg.length_groups(sequence_lengths(ro), 4)) == 4


@pytest.mark.parametrize("with_entropy", [False, True])
def test_grouped_policy_forward_equals_one_pass_with_gradients(models, with_entropy):
    actor, _ = models
    ro = _rollout()
    mask = ro.action_mask
    results = {}
    for groups in (1, 4):
        actor.zero_grad()
        logp, ent = policy_forward(
            actor, ro, 0.7, with_entropy=with_entropy, groups=lg.Grouping(groups)
        )
        loss = (logp * mask).sum() + ((ent * mask).sum() if with_entropy else 0)
        loss.backward()
        grads = [p.grad.clone() for p in actor.parameters()]
        results[groups] = (logp, ent, grads)
    (l1, e1, g1), (l4, e4, g4) = results[1], results[4]
    torch.testing.assert_close(l4[mask], l1[mask], rtol=0, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(e4[mask], e1[mask], rtol=0, atol=1e-5)
    for a, b in zip(g4, g1, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_grouped_policy_forward_chunks_rows_without_grad(models):
    """The no-grad memory chunks apply inside each group."""
    actor, _ = models
    ro = _rollout()
    with torch.no_grad():
        one, _ = policy_forward(actor, ro, 1.0)
        chunked, _ = policy_forward(actor, ro, 1.0, groups=lg.Grouping(3), chunk_elements=12 * 1000)
    torch.testing.assert_close(chunked[ro.action_mask], one[ro.action_mask], rtol=0, atol=1e-5)


def test_grouped_critic_and_reward_forward_equal_one_pass(models):
    _, critic = models
    ro = _rollout()
    critic.zero_grad()
    v1 = critic_forward(critic, ro)
    (v1 * ro.action_mask).sum().backward()
    g1 = [p.grad.clone() for p in critic.parameters()]
    critic.zero_grad()
    v4 = critic_forward(critic, ro, groups=lg.Grouping(4))
    (v4 * ro.action_mask).sum().backward()
    g4 = [p.grad.clone() for p in critic.parameters()]
    torch.testing.assert_close(v4[ro.action_mask], v1[ro.action_mask], rtol=0, atol=1e-5)
    for a, b in zip(g4, g1, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        r1 = reward_forward(critic, ro)
        r4 = reward_forward(critic, ro, groups=lg.Grouping(4))
    assert r4.shape == r1.shape
    valid = ro.attention_mask
    torch.testing.assert_close(r4[valid], r1[valid], rtol=0, atol=1e-5)
    # the reference path ignores the groups: one pass with the padding mask
    torch.testing.assert_close(
        reward_forward(critic, ro, all_positions=True, groups=lg.Grouping(4)),
        reward_forward(critic, ro, all_positions=True),
    )


def _packed_run_cost(run: list[int], w: float) -> float:
    """One packed group's cost, by hand (``packed_cost``'s docstring)."""
    C, n, S = max(run), len(run), sum(run)
    K = max(-(-S // C), sum(1 for x in run if x > C / 2))
    return K * C * (1 + w * C) if K < n else n * C * (1 + w * C / 2)


def test_packed_cost_by_hand():
    s = torch.tensor([2.0, 3.0, 4.0, 10.0])
    cost = lg.packed_cost(s, 0.1)
    # rows 2, 3, 4: 9 tokens need 3 bins of 4, one row each: the padded rows, attended causally
    assert cost[0, 3] == pytest.approx(3 * 4 * (1 + 0.2))
    assert cost[3, 4] == pytest.approx(1 * 10 * (1 + 0.5))
    assert cost[0, 4] == pytest.approx(2 * 10 * (1 + 1.0))  # 19 tokens in 2 bins of 10, shared
    assert lg.packed_cost(torch.tensor([2.0, 2.0, 4.0]), 0.1)[0, 3] == pytest.approx(2 * 4 * 1.4)
    for i in range(4):
        for j in range(i + 1, 5):
            run = s[i:j].long().tolist()
            assert float(cost[i, j]) == pytest.approx(_packed_run_cost(run, 0.1)), (i, j)


@pytest.mark.parametrize("seed", range(6))
def test_packed_groups_are_the_cheapest_contiguous_split(seed):
    g = torch.Generator().manual_seed(seed)
    B = 2 + seed
    lengths = torch.randint(1, 300, (B,), generator=g)
    L = sorted(lengths.tolist())
    w, call = 0.002, 50.0
    groups = lg.length_groups(lengths, 3, call_tokens=call, packed_attention=w)
    assert sorted(int(i) for gr in groups for i in gr) == list(range(B))

    def cost(runs):
        return sum(_packed_run_cost(r, w) for r in runs) + call * len(runs)

    best = min(
        cost([L[a:b] for a, b in zip((0, *cuts), (*cuts, B), strict=True)])
        for k in range(3)
        for cuts in itertools.combinations(range(1, B), k)
    )
    got = [sorted(int(lengths[i]) for i in gr) for gr in groups]

    def shares(run):
        C = max(run)
        return max(-(-sum(run) // C), sum(1 for x in run if x > C / 2)) < len(run)

    if any(shares(r) for r in got):
        assert cost(got) == pytest.approx(best), (L, got)
    else:  # packing would put each row alone: the padded groups
        padded = lg.length_groups(lengths, 3, call_tokens=call)
        assert [g.tolist() for g in groups] == [g.tolist() for g in padded]


def test_packed_groups_fall_back_to_the_padded_ones_where_no_bin_is_shared():
    lengths = torch.tensor([89, 100, 101, 112, 116, 120, 121, 123, 128, 133, 140, 147, 148])
    packed = lg.length_groups(lengths, 4, call_tokens=64, packed_attention=0.0014)
    assert [g.tolist() for g in packed] == [g.tolist() for g in lg.length_groups(lengths, 4, 64)]
    # where a pass costs 400 positions, the short rows share the long rows' bins in one packed pass (the
    # padded groups would be two: 3 x 12 and 3 x 200 positions against 6 x 200)
    lengths = torch.tensor([10, 12, 9, 200, 190, 180])
    packed = lg.length_groups(lengths, 4, call_tokens=400, packed_attention=0.0014)
    assert [sorted(lengths[g].tolist()) for g in packed] == [[9, 10, 12, 180, 190, 200]]
    assert len(lg.length_groups(lengths, 4, call_tokens=400)) == 2
