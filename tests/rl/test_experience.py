"""MA-PPO's experience and update math against a separately written token-level PPO (plain loops)."""

import math

import torch

from marlhf.macro import MacroConfig, build_termination
from marlhf.rl.config import PPOConfig, PPOStageConfig
from marlhf.rl.experience import make_experience
from marlhf.rl.losses import policy_loss
from marlhf.rl.rollout import Rollout


def _rollout(B=3, A=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 3, 5]
    mask = torch.zeros(B, A, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    ids = torch.randint(4, 50, (B, A), generator=g).masked_fill(~mask, 0)
    ends = torch.tensor([True, False, True])
    ro = Rollout(
        sequences=torch.zeros(B, 10, dtype=torch.long),
        attention_mask=torch.ones(B, 10, dtype=torch.bool),
        response_start=torch.full((B,), 4),
        response_ids=ids,
        action_mask=mask,
        ends_with_eos=ends,
        prompt_ids=["a", "b", "c"],
    )
    scored = {
        "old_logprobs": -torch.rand(B, A, generator=g) * 3,
        "ref_logprobs": -torch.rand(B, A, generator=g) * 3,
        "values": torch.randn(B, A, generator=g),
        "entropy": torch.rand(B, A, generator=g),
        "ref_entropy": None,
    }
    scores = torch.tensor([3.0, -0.7, 1.2])  # 3.0 is clipped to 2.5
    return ro, scored, scores, lengths


def _token_ppo_reference(ro, scored, scores, lengths, kl_coef, clip, gamma, lam):
    """Textbook token-level PPO, one row and one token at a time."""
    B, A = ro.response_ids.shape
    adv = torch.zeros(B, A, dtype=torch.float64)
    ret = torch.zeros(B, A, dtype=torch.float64)
    for b in range(B):
        n = lengths[b]
        r = [
            -kl_coef * (float(scored["old_logprobs"][b, t]) - float(scored["ref_logprobs"][b, t]))
            for t in range(n)
        ]
        r[n - 1] += max(-clip, min(clip, float(scores[b])))
        v = [float(scored["values"][b, t]) for t in range(n)]
        last = 0.0
        for t in reversed(range(n)):
            v_next = v[t + 1] if t + 1 < n else 0.0
            delta = r[t] + gamma * v_next - v[t]
            last = delta + gamma * lam * last
            adv[b, t] = last
            ret[b, t] = last + v[t]
    return adv, ret


def test_ngram_1_is_exactly_token_level_ppo():
    ro, scored, scores, lengths = _rollout()
    cfg = PPOStageConfig(
        ppo=PPOConfig(kl_ctl=0.1, gamma=0.97, lam=0.9, reward_clip=2.5),
        macro=MacroConfig(termination_condition="fixed", ngram=1),
    )
    rule = build_termination(cfg.macro)
    exp = make_experience(ro, scored, scores, rule, cfg, kl_coef=0.1)
    ref_adv, ref_ret = _token_ppo_reference(ro, scored, scores, lengths, 0.1, 2.5, 0.97, 0.9)
    m = ro.action_mask
    torch.testing.assert_close(exp.advantages[m].double(), ref_adv[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exp.returns[m].double(), ref_ret[m], atol=1e-5, rtol=1e-5)
    # the same policy loss as a per-token loop, at token and macro ratio level (one-token macros)
    new_logp = scored["old_logprobs"] + 0.3 * torch.randn_like(scored["old_logprobs"])
    total, count = 0.0, 0
    for b in range(3):
        for t in range(lengths[b]):
            ratio = math.exp(float(new_logp[b, t]) - float(scored["old_logprobs"][b, t]))
            a = float(ref_adv[b, t])
            total += max(-a * ratio, -a * min(max(ratio, 0.8), 1.2))
            count += 1
    for level in ("token", "macro"):
        loss, _ = policy_loss(
            new_logp,
            scored["old_logprobs"],
            exp.advantages,
            m,
            cliprange=0.2,
            ratio_level=level,
            segment_ids=exp.segment_ids,
        )
        assert abs(float(loss) - total / count) < 1e-5


def test_macro_actions_share_advantages_and_score_lands_on_last_valid_token():
    ro, scored, scores, lengths = _rollout()
    cfg = PPOStageConfig(
        ppo=PPOConfig(kl_ctl=0.05),
        macro=MacroConfig(termination_condition="fixed", ngram=2, eos_own_macro=True),
    )
    exp = make_experience(ro, scored, scores, build_termination(cfg.macro), cfg, kl_coef=0.05)
    for b, n in enumerate(lengths):
        # the clipped score sits on the last valid token, never on padding
        kl_last = -0.05 * (scored["old_logprobs"][b, n - 1] - scored["ref_logprobs"][b, n - 1])
        expected = kl_last + max(-2.5, min(2.5, float(scores[b])))
        assert abs(float(exp.rewards[b, n - 1]) - float(expected)) < 1e-5
        assert torch.all(exp.rewards[b, n:] == 0)
        # tokens of one macro action share its advantage
        ids = exp.segment_ids[b, :n]
        for k in ids.unique():
            vals = exp.advantages[b, :n][ids == k]
            assert torch.allclose(vals, vals[0].expand_as(vals))
    # row 0 (6 tokens, ends with EOS): {0,1} {2,3} {4} {5=EOS}
    assert exp.segment_ids[0].tolist() == [0, 0, 1, 1, 2, 3]
    # row 1 (3 tokens, truncated, no EOS): {0,1} {2}
    assert exp.segment_ids[1, :3].tolist() == [0, 0, 1]
    assert exp.stats["macro/count"] > 0


def test_entropy_threshold_is_logged_with_the_hand_computed_value():
    # row 0: 5 tokens ending with EOS; row 1: 3 tokens, truncated; padding entropy is huge (ignored)
    B, A = 2, 5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    ro = Rollout(
        sequences=torch.zeros(B, 8, dtype=torch.long),
        attention_mask=torch.ones(B, 8, dtype=torch.bool),
        response_start=torch.full((B,), 3),
        response_ids=torch.arange(B * A).view(B, A) + 4,
        action_mask=mask,
        ends_with_eos=torch.tensor([True, False]),
        prompt_ids=["a", "b"],
    )
    scored = {
        "old_logprobs": torch.full((B, A), -1.0),
        "ref_logprobs": torch.full((B, A), -1.0),
        "values": torch.zeros(B, A),
        "entropy": torch.ones(B, A),
        "ref_entropy": torch.tensor([[9.0, 0.5, 3.0, 1.0, 7.0], [8.0, 2.0, 0.7, 100.0, 100.0]]),
    }
    cfg = PPOStageConfig(
        macro=MacroConfig(termination_condition="entropy", target_macro_len=2.0),
    )
    exp = make_experience(
        ro, scored, torch.zeros(B), build_termination(cfg.macro), cfg, kl_coef=0.1
    )
    # N = 8 tokens, target 2 -> 4 macro actions; 2 rows and 1 forced EOS boundary leave K = 1.
    # Candidates (j >= 1, not the forced EOS): 0.5, 3.0, 1.0 | 2.0, 0.7 -> the 2nd highest, 2.0.
    assert exp.stats["macro/entropy_threshold"] == 2.0
    # only 3.0 > 2.0 starts a macro action: {0,1} {2,3} {4=EOS} and {0,1,2}
    assert exp.segment_ids.tolist() == [[0, 0, 1, 1, 2], [0, 0, 0, -1, -1]]
    assert exp.stats["macro/count"] == 2.0  # (3 + 1) / 2
    # a fixed threshold is logged as given
    fixed = PPOStageConfig(
        macro=MacroConfig(termination_condition="entropy", entropy_threshold=0.8)
    )
    exp = make_experience(
        ro, scored, torch.zeros(B), build_termination(fixed.macro), fixed, kl_coef=0.1
    )
    assert exp.stats["macro/entropy_threshold"] == 0.8
    assert exp.segment_ids.tolist() == [[0, 0, 1, 2, 3], [0, 1, 1, -1, -1]]  # 3.0, 1.0 | 2.0


def test_macro_ends_rebuild_the_segments_of_gathered_rows():
    """After the experience is gathered over ranks, segments are rebuilt from segment ids alone."""
    from marlhf.macro import build_segments
    from marlhf.rl.experience import macro_ends

    ids = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, -1, -1], [-1, -1, -1, -1, -1]])
    ends = macro_ends(ids)
    assert ends.int().tolist() == [[0, 1, 0, 1, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert torch.equal(build_segments(ends, ids >= 0).ids, ids)


def test_global_rows_follow_the_batching_of_prompts():
    """A rank's rows are numbered as in one process with the whole batch: with the identity
    permutation, step 0's prompt indices (`step_micro_batches`) are the global row indices."""
    import doctest

    import numpy as np

    import marlhf.rl.experience as experience
    from marlhf.batching import step_micro_batches

    for world, block, batches in ((1, 4, 2), (2, 2, 2), (3, 1, 4), (2, 3, 1)):
        perm = np.arange(world * block * batches)
        seen = []
        for r in range(world):
            idx = sum(step_micro_batches(perm, 0, block, batches, world, r), [])
            assert experience.global_rows(block * batches, block, r, world).tolist() == idx
            seen += idx
        assert sorted(seen) == perm.tolist()
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(
        experience.global_rows, "global_rows", globs={"global_rows": experience.global_rows}
    ):
        runner.run(test)
    assert runner.failures == 0 and runner.tries == 1
