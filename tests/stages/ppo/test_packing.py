"""PPO's forward passes over packed rows give the padded passes' log-probs, entropies, values and
gradients; the scoring passes by a token budget give the one-pass outputs; and the update by a
token budget accumulates the gradient of the whole minibatch, in every loss aggregation mode and
ratio level, for the actor and the critic."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from marlhf.models.reward_model import RewardModel
from marlhf.models.sequences import pack_flush_left, response_mask
from marlhf.runtime.length_groups import Grouping
from marlhf.stages.ppo.config import PerfConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.experience import Experience
from marlhf.stages.ppo.forward import critic_forward, policy_forward, reward_forward
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.update import Minibatch, actor_step, critic_step
from tests.support.engine_stub import Engine
from tests.support.tiny_models import tiny_gemma_config

VOCAB = 200
PADDED = Grouping(1)
PACKED = Grouping(1, packing=True)


class TrainEngine(Engine):
    """An engine that trains like DeepSpeed's from the outside: ``backward`` accumulates into the
    module's gradients, ``step`` is left to the test; counts the forward passes."""

    def __init__(self, module):
        super().__init__(module)
        self.calls = 0

    def forward(self, **kwargs):
        self.calls += 1
        return self.module(**kwargs)

    def backward(self, loss):
        loss.backward()

    def step(self):
        pass


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModel, GemmaForCausalLM

    torch.manual_seed(0)
    actor = GemmaForCausalLM(tiny_gemma_config(VOCAB)).eval()
    critic = RewardModel(AutoModel.from_config(tiny_gemma_config(VOCAB)), init_std=0.5).eval()
    return actor, critic


def _rollout(B=7, P=30, A=12, seed=0):
    """Rows of very different lengths: prompts of 4..30 tokens (one of 1), responses of 1..12."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, VOCAB, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    response = torch.randint(5, VOCAB, (B, A), generator=g)
    for b in range(B):
        prompt_mask[b, : (b * 11) % (P - 3)] = 0
        response[b, (b * 5) % A] = 1  # an EOS
    prompt_mask[-1, :-1] = 0  # a one-token prompt
    mask, ends = response_mask(response, eos_ids=[1])
    seq, att, start = pack_flush_left(prompt, prompt_mask, response, mask, pad_id=0)
    return Rollout(seq, att, start, response, mask, ends, [str(b) for b in range(B)])


def _grads(module):
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


@pytest.mark.parametrize(
    "with_entropy,packed", [(False, PACKED), (True, PACKED), (True, Grouping(4, packing=True))]
)
def test_packed_policy_forward_equals_padded_with_gradients(models, with_entropy, packed):
    """One packed pass, and packed length groups (each group's rows in bins of its own width)."""
    actor = TrainEngine(models[0])
    ro = _rollout()
    mask = ro.action_mask
    out = {}
    for name, groups in (("padded", PADDED), ("packed", packed)):
        actor.zero_grad()
        actor.calls = 0
        logp, ent = policy_forward(actor, ro, 0.7, with_entropy=with_entropy, groups=groups)
        loss = (logp * mask).sum() + ((ent * mask).sum() if with_entropy else 0)
        loss.backward()
        out[name] = (logp, ent, _grads(actor), actor.calls)
    (l0, e0, g0, _), (l1, e1, g1, calls) = out["padded"], out["packed"]
    assert calls == 1 if packed.max_groups == 1 else calls > 1
    torch.testing.assert_close(l1[mask], l0[mask], rtol=0, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(e1[mask], e0[mask], rtol=0, atol=1e-5)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # against the reference path: the head at every position, the padding mask
    with torch.no_grad():
        ref, _ = policy_forward(actor, ro, 0.7, all_positions=True)
    torch.testing.assert_close(l1[mask], ref[mask], rtol=0, atol=1e-5)


def test_packed_critic_and_reward_forward_equal_padded(models):
    critic = TrainEngine(models[1])
    ro = _rollout(seed=1)
    out = {}
    for name, groups in (("padded", PADDED), ("packed", Grouping(4, packing=True))):
        critic.zero_grad()
        v = critic_forward(critic, ro, groups=groups)
        (v * ro.action_mask).sum().backward()
        out[name] = (v, _grads(critic))
    (v0, g0), (v1, g1) = out["padded"], out["packed"]
    torch.testing.assert_close(v1[ro.action_mask], v0[ro.action_mask], rtol=0, atol=1e-5)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        r0 = reward_forward(critic, ro, all_positions=True)
        r1 = reward_forward(critic, ro, groups=PACKED)
    valid = ro.attention_mask
    assert r1.shape == r0.shape
    torch.testing.assert_close(r1[valid], r0[valid], rtol=0, atol=1e-5)


@pytest.mark.parametrize("packing", [False, True])
def test_scoring_by_a_token_budget_equals_one_pass(models, packing):
    actor, critic = TrainEngine(models[0]), TrainEngine(models[1])
    ro = _rollout(seed=2)
    budget = Grouping(1, packing=packing, max_tokens=60)
    with torch.no_grad():
        logp, ent = policy_forward(actor, ro, 1.0, with_entropy=True)
        actor.calls = 0
        logp_b, ent_b = policy_forward(actor, ro, 1.0, with_entropy=True, groups=budget)
        assert actor.calls > 1
        # and the logits' memory chunks inside each micro-batch
        logp_c, _ = policy_forward(actor, ro, 1.0, groups=budget, chunk_elements=12 * VOCAB)
        values, values_b = critic_forward(critic, ro), critic_forward(critic, ro, groups=budget)
        rm, rm_b = reward_forward(critic, ro), reward_forward(critic, ro, groups=budget)
    m, valid = ro.action_mask, ro.attention_mask
    for x, y in ((logp_b, logp), (ent_b, ent), (logp_c, logp), (values_b, values)):
        torch.testing.assert_close(x[m], y[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(rm_b[valid], rm[valid], rtol=0, atol=1e-5)


def _experience(ro: Rollout, seed=0, ngram=3) -> Experience:
    g = torch.Generator().manual_seed(seed)
    B, A = ro.action_mask.shape
    mask = ro.action_mask
    seg = torch.where(mask, torch.arange(A) // ngram, -1)
    z = torch.zeros(B, A)
    return Experience(
        ro, -torch.rand(B, A, generator=g) - 1, -torch.rand(B, A, generator=g) - 1,
        torch.randn(B, A, generator=g), torch.zeros(B), z, z, seg, z, torch.zeros(B).bool(),
        advantages=torch.randn(B, A, generator=g), returns=torch.randn(B, A, generator=g),
    )  # fmt: skip


def _whole_minibatch(exp: Experience, ppo: PPOConfig) -> Minibatch:
    from marlhf.algo.losses import policy_terms

    ro = exp.rollout
    terms = policy_terms(ro.action_mask, ppo.ratio_level, exp.segment_ids)
    B = ro.action_mask.shape[0]
    return Minibatch(torch.arange(B), ro, ro.action_mask.sum(), terms.sum(), 1, terms.any(1).sum())


@pytest.mark.parametrize(
    "mode,level",
    [("token-mean", "token"), ("seq-mean-token-mean", "macro"), ("seq-mean-token-sum", "token"),
     ("seq-mean-token-sum-norm", "sequence")],
)  # fmt: skip
@pytest.mark.parametrize("packing", [False, True])
def test_token_budget_update_accumulates_the_whole_minibatch_gradient(models, mode, level, packing):
    actor, critic = TrainEngine(models[0]), TrainEngine(models[1])
    ro = _rollout(seed=3)
    exp = _experience(ro)
    results = {}
    for budget in (0, 50):
        cfg = PPOStageConfig(
            ppo=PPOConfig(loss_agg_mode=mode, ratio_level=level, entropy_coef=0.01,
                          kl_loss_coef=0.1),
            perf=PerfConfig(length_groups=1),
        )  # fmt: skip
        cfg.perf.batching.packing = packing
        cfg.perf.batching.max_tokens_per_micro_batch = budget
        m = _whole_minibatch(exp, cfg.ppo)
        models_ns = SimpleNamespace(actor=actor, critic=critic)
        actor.zero_grad(), critic.zero_grad()
        actor.calls = critic.calls = 0
        a_stats = actor_step(models_ns, exp, m, cfg)
        c_stats = critic_step(models_ns, exp, m, cfg)
        results[budget] = (a_stats, c_stats, _grads(actor), _grads(critic), actor.calls)
    whole, split = results[0], results[50]
    assert whole[4] == 1 and split[4] > 2  # the budget cut the minibatch
    for k in whole[0]:
        assert float(split[0][k]) == pytest.approx(float(whole[0][k]), rel=1e-4, abs=1e-6), k
    for k in whole[1]:
        assert float(split[1][k]) == pytest.approx(float(whole[1][k]), rel=1e-4, abs=1e-6), k
    for a, b in zip(split[2] + split[3], whole[2] + whole[3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
