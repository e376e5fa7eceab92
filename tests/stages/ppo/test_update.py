"""The actor step's loss with --loss_agg_mode and --kl_loss_coef, against a plain-Python reference."""

import math
from types import SimpleNamespace

import pytest
import torch

from marlhf.stages.ppo.config import GenerationConfig, PerfConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.experience import Experience
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.update import Minibatch, actor_step
from tests.support.engine_stub import LogitsActor


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl_type", ["k1", "k3"])
def test_kl_loss_is_reduced_like_the_policy_loss(mode, kl_type):
    B, P, A, V = 2, 2, 3, 5
    T = P + A
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, V, (B, T), generator=g)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    att = torch.cat([torch.ones(B, P).bool(), mask], 1)
    ro = Rollout(seq, att, torch.full((B,), P), seq[:, P:], mask, torch.ones(B).bool(), ["a", "b"])
    old = -torch.rand(B, A, generator=g) - 1
    ref = -torch.rand(B, A, generator=g) - 1
    adv = torch.randn(B, A, generator=g)
    exp = Experience(
        ro, old, ref, torch.zeros(B, A), torch.zeros(B), torch.zeros(B, A), torch.zeros(B, A),
        torch.where(mask, 0, -1), torch.zeros(B, A), torch.zeros(B).bool(), advantages=adv,
    )  # fmt: skip
    cfg = PPOStageConfig(
        generation=GenerationConfig(max_answer_seq_len=4, temperature=1.0),
        ppo=PPOConfig(loss_agg_mode=mode, kl_loss_coef=0.3, kl_loss_type=kl_type, cliprange=0.2),
        # the fake engine has logits only (no module to apply the LM head at chosen positions)
        perf=PerfConfig(score_all_positions=True),
    )
    actor = LogitsActor(T, V)
    m = Minibatch(torch.arange(B), ro, mask.sum(), mask.sum(), 1, torch.tensor(B))
    stats = actor_step(SimpleNamespace(actor=actor), exp, m, cfg.trainer)
    # reference: per-token log-probs from the logits, then the two losses by hand
    logp = torch.log_softmax(actor.logits[0].detach(), -1)
    lengths = mask.sum(1).tolist()
    pg_rows, kl_rows = [], []
    for b in range(B):
        pg_t, kl_t = [], []
        for t in range(lengths[b]):
            lp = float(logp[P - 1 + t, seq[b, P + t]])
            ratio = math.exp(lp - float(old[b, t]))
            a = float(adv[b, t])
            pg_t.append(max(-a * ratio, -a * min(max(ratio, 0.8), 1.2)))
            d = lp - float(ref[b, t])
            kl_t.append(d if kl_type == "k1" else math.exp(-d) - 1 + d)
        pg_rows.append(pg_t)
        kl_rows.append(kl_t)

    def reduce(rows):
        if mode == "token-mean":
            return sum(map(sum, rows)) / sum(lengths)
        if mode == "seq-mean-token-mean":
            return sum(sum(r) / len(r) for r in rows) / B
        return sum(map(sum, rows)) / (B * 4)

    assert float(stats["loss/policy"]) == pytest.approx(reduce(pg_rows), abs=1e-5)
    assert float(stats["loss/kl"]) == pytest.approx(reduce(kl_rows), abs=1e-5)
    assert actor.losses == [pytest.approx(reduce(pg_rows) + 0.3 * reduce(kl_rows), abs=1e-5)]
