"""MA-PPO's experience and update math against a separately written token-level PPO (plain loops)."""

import math

import pytest
import torch

from marlhf.algo.losses import policy_loss
from marlhf.macro import MacroConfig, build_termination
from marlhf.stages.ppo.config import PPOConfig, PPOStageConfig
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.scoring import Scored
from tests.support.ppo_experience import loop_experience


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
    scored = Scored(
        old_logprobs=-torch.rand(B, A, generator=g) * 3,
        ref_logprobs=-torch.rand(B, A, generator=g) * 3,
        values=torch.randn(B, A, generator=g),
        entropy=torch.rand(B, A, generator=g),
        ref_entropy=None,
    )
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
            -kl_coef * (float(scored.old_logprobs[b, t]) - float(scored.ref_logprobs[b, t]))
            for t in range(n)
        ]
        r[n - 1] += max(-clip, min(clip, float(scores[b])))
        v = [float(scored.values[b, t]) for t in range(n)]
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
    exp = loop_experience(rule, ro, scored, scores, cfg, 0.1)
    ref_adv, ref_ret = _token_ppo_reference(ro, scored, scores, lengths, 0.1, 2.5, 0.97, 0.9)
    m = ro.action_mask
    torch.testing.assert_close(exp.advantages[m].double(), ref_adv[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(exp.returns[m].double(), ref_ret[m], atol=1e-5, rtol=1e-5)
    # the same policy loss as a per-token loop, at token and macro ratio level (one-token macros)
    new_logp = scored.old_logprobs + 0.3 * torch.randn_like(scored.old_logprobs)
    total, count = 0.0, 0
    for b in range(3):
        for t in range(lengths[b]):
            ratio = math.exp(float(new_logp[b, t]) - float(scored.old_logprobs[b, t]))
            a = float(ref_adv[b, t])
            total += max(-a * ratio, -a * min(max(ratio, 0.8), 1.2))
            count += 1
    for level in ("token", "macro"):
        loss, _ = policy_loss(
            new_logp,
            scored.old_logprobs,
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
    exp = loop_experience(build_termination(cfg.macro), ro, scored, scores, cfg, 0.05)
    for b, n in enumerate(lengths):
        # the clipped score sits on the last valid token, never on padding
        kl_last = -0.05 * (scored.old_logprobs[b, n - 1] - scored.ref_logprobs[b, n - 1])
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
    scored = Scored(
        old_logprobs=torch.full((B, A), -1.0),
        ref_logprobs=torch.full((B, A), -1.0),
        values=torch.zeros(B, A),
        entropy=torch.ones(B, A),
        ref_entropy=torch.tensor([[9.0, 0.5, 3.0, 1.0, 7.0], [8.0, 2.0, 0.7, 100.0, 100.0]]),
    )
    cfg = PPOStageConfig(
        macro=MacroConfig(termination_condition="entropy", target_macro_len=2.0),
    )
    exp = loop_experience(build_termination(cfg.macro), ro, scored, torch.zeros(B), cfg, 0.1)
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
    exp = loop_experience(build_termination(fixed.macro), ro, scored, torch.zeros(B), fixed, 0.1)
    assert exp.stats["macro/entropy_threshold"] == 0.8
    assert exp.segment_ids.tolist() == [[0, 0, 1, 2, 3], [0, 1, 1, -1, -1]]  # 3.0, 1.0 | 2.0


def test_macro_ends_rebuild_the_segments_of_gathered_rows():
    """After the experience is gathered over ranks, segments are rebuilt from segment ids alone."""
    from marlhf.macro import build_segments
    from marlhf.stages.ppo.experience import macro_ends

    ids = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, -1, -1], [-1, -1, -1, -1, -1]])
    ends = macro_ends(ids)
    assert ends.int().tolist() == [[0, 1, 0, 1, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert torch.equal(build_segments(ends, ids >= 0).ids, ids)


# --------------------------------------------------------------------------------------------------
# the estimators wired into the experience


def _kl_reward(scored, b, t, kl_coef):
    return -kl_coef * (float(scored.old_logprobs[b, t]) - float(scored.ref_logprobs[b, t]))


def test_weighted_macro_reward_keeps_a_truncated_rows_score_whole():
    """With --macro_reward_agg weighted, the KL rewards of a macro action are averaged
    but the sequence score enters the last macro action whole, also for a truncated row, whose last
    macro action is an ordinary chunk (here row 1: 3 tokens, no EOS, one macro action of 3)."""
    ro, scored, scores, lengths = _rollout()
    cfg = PPOStageConfig(
        ppo=PPOConfig(kl_ctl=0.1, gamma=1.0, lam=1.0, reward_clip=2.5),
        macro=MacroConfig(
            termination_condition="fixed",
            ngram=3,
            value_function="equal",
            macro_reward_agg="weighted",
        ),
    )
    exp = loop_experience(build_termination(cfg.macro), ro, scored, scores, cfg, 0.1)
    assert exp.segment_ids[1, :3].tolist() == [0, 0, 0]
    kl = sum(_kl_reward(scored, 1, t, 0.1) for t in range(3)) / 3
    v = float(scored.values[1, :3].mean())
    expected = kl + float(scores[1]) - v  # one macro action: A = R - V, the score not divided by 3
    torch.testing.assert_close(exp.advantages[1, :3], torch.full((3,), expected), atol=1e-5, rtol=0)
    # `sum` is unchanged: the score with the KL rewards of the macro action
    cfg.macro = MacroConfig(termination_condition="fixed", ngram=3, value_function="equal")
    exp = loop_experience(build_termination(cfg.macro), ro, scored, scores, cfg, 0.1)
    kl_sum = sum(_kl_reward(scored, 1, t, 0.1) for t in range(3))
    assert float(exp.advantages[1, 0]) == pytest.approx(kl_sum + float(scores[1]) - v, abs=1e-5)


def _grouped_rollout(B=4, A=5, seed=3):
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 2, 4, 3]
    mask = torch.zeros(B, A, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    ro = Rollout(
        sequences=torch.zeros(B, 9, dtype=torch.long),
        attention_mask=torch.ones(B, 9, dtype=torch.bool),
        response_start=torch.full((B,), 4),
        response_ids=torch.randint(4, 50, (B, A), generator=g).masked_fill(~mask, 0),
        action_mask=mask,
        ends_with_eos=torch.tensor([True, False, True, True]),
        prompt_ids=["p", "p", "q", "q"],
    )
    scored = Scored(
        old_logprobs=-torch.rand(B, A, generator=g) * 3,
        ref_logprobs=-torch.rand(B, A, generator=g) * 3,
        values=torch.zeros(B, A),
        entropy=torch.rand(B, A, generator=g),
        ref_entropy=None,
    )
    return ro, scored, torch.tensor([0.5, 3.0, -1.0, 0.2]), lengths


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_read_clipped_scores_kl_rewards_and_groups_of_G_rows(name):
    """Rows 2i and 2i + 1 answer one prompt (G = 2). Reference in plain Python: the group baseline
    on the clipped score minus the no-EOS penalty's row, then the return-to-go of the KL rewards."""
    import statistics

    ro, scored, scores, lengths = _grouped_rollout()
    ppo = PPOConfig(
        kl_ctl=0.1,
        reward_clip=2.5,
        no_eos_penalty=-0.5,
        advantage_estimator=name,
        n_samples_per_prompt=2,
        reward_source="gold",  # a critic-free stage config needs a reward model path otherwise
    )
    cfg = PPOStageConfig(ppo=ppo, macro=MacroConfig(termination_condition="fixed", ngram=2))
    exp = loop_experience(build_termination(cfg.macro), ro, scored, scores, cfg, 0.1)
    assert exp.returns is None
    r = [max(-2.5, min(2.5, float(s))) for s in scores]
    r = [x + (0.0 if e else -0.5) for x, e in zip(r, ro.ends_with_eos.tolist(), strict=True)]
    for b, n in enumerate(lengths):
        mate = b ^ 1
        if name == "grpo":
            pair = [r[b], r[mate]]
            outcome = (r[b] - statistics.fmean(pair)) / (statistics.stdev(pair) + 1e-6)
        elif name == "dr_grpo":
            outcome = r[b] - (r[b] + r[mate]) / 2
        else:
            outcome = r[b] - r[mate]
        for t in range(n):
            kl_to_go = sum(_kl_reward(scored, b, u, 0.1) for u in range(t, n))
            assert float(exp.advantages[b, t]) == pytest.approx(outcome + kl_to_go, abs=1e-4)
        assert torch.all(exp.advantages[b, n:] == 0)
    assert "group/score_std" in exp.stats


def test_macro_mc_reads_the_monte_carlo_values_of_the_experience():
    """V̂ at the boundaries from exp.mc_*; V̂(prompt) the leave-one-out group mean (G = 2), or the
    prompt's own Monte-Carlo value (G = 1). Plain-Python reference of the SPO-chain advantage."""
    ro, scored, scores, lengths = _grouped_rollout()
    for G in (2, 1):
        ppo = PPOConfig(
            kl_ctl=0.1, advantage_estimator="macro_mc", n_samples_per_prompt=G, reward_source="gold"
        )
        cfg = PPOStageConfig(ppo=ppo, macro=MacroConfig(termination_condition="fixed", ngram=2))
        rule = build_termination(cfg.macro)
        from marlhf.stages.ppo.experience import estimate, segment, token_rewards

        term = segment(rule, ro, scored)
        exp = token_rewards(ro, scored, scores, term, cfg.ppo, 0.1)
        # boundaries: row 0 at 2 and 4, row 1 none, row 2 at 2, row 3 at 2
        exp.mc_positions = torch.tensor([[2, 4], [-1, -1], [2, -1], [2, -1]])
        exp.mc_values = torch.tensor([[0.3, -0.2], [0.0, 0.0], [1.1, 0.0], [0.4, 0.0]])
        exp.mc_prompt_values = torch.tensor([0.7, 0.1, -0.3, 0.9]) if G == 1 else None
        exp = estimate(exp, term, cfg.ppo, cfg.macro)
        r = [max(-2.5, min(2.5, float(s))) for s in scores]
        for b, n in enumerate(lengths):
            v0 = float(exp.mc_prompt_values[b]) if G == 1 else r[b ^ 1]
            pos = [p for p in exp.mc_positions[b].tolist() if p >= 0]
            vals = [v0, *exp.mc_values[b, : len(pos)].tolist(), r[b]]
            edges = [0, *pos, n]
            for j in range(len(edges) - 1):
                kl = sum(_kl_reward(scored, b, u, 0.1) for u in range(edges[j], edges[j + 1]))
                for t in range(edges[j], edges[j + 1]):
                    expected = vals[j + 1] - vals[j] + kl
                    assert float(exp.advantages[b, t]) == pytest.approx(expected, abs=1e-5), (
                        G,
                        b,
                        t,
                    )


def _on(obj, device):
    """A copy of a rollout / scored dataclass with its tensors on ``device``."""
    from dataclasses import fields, replace

    moved = {f.name: getattr(obj, f.name).to(device) for f in fields(obj)
             if isinstance(getattr(obj, f.name), torch.Tensor)}  # fmt: skip
    return replace(obj, **moved)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gae", "grpo", "dr_grpo", "rloo"])
def test_every_estimator_runs_on_cuda_and_equals_cpu(name):
    """The whole estimate (advantages, returns, statistics: group statistics included) with every
    tensor on the GPU equals the CPU one: no tensor is made on the CPU beside them."""
    ro, scored, scores, _ = _grouped_rollout()
    ppo = PPOConfig(kl_ctl=0.1, advantage_estimator=name, n_samples_per_prompt=2,
                    reward_source="gold")  # fmt: skip
    cfg = PPOStageConfig(ppo=ppo, macro=MacroConfig(termination_condition="fixed", ngram=2))
    cpu = loop_experience(build_termination(cfg.macro), ro, scored, scores, cfg, 0.1)
    gpu = loop_experience(build_termination(cfg.macro), _on(ro, "cuda"), _on(scored, "cuda"),
                          scores.cuda(), cfg, 0.1)  # fmt: skip
    assert gpu.advantages.device.type == "cuda"
    torch.testing.assert_close(gpu.advantages.cpu(), cpu.advantages)
    assert gpu.stats.keys() == cpu.stats.keys()
    for k, v in cpu.stats.items():
        assert gpu.stats[k] == pytest.approx(v, abs=1e-6), k
