"""--macro_credit boundary in the trainer (the estimate's credit mask, the minibatch counts and the
actor's loss over the boundary tokens only) and macro_mc's spaced boundaries, against loops."""

import math
from types import SimpleNamespace

import pytest
import torch

from marlhf.algo.estimators import select_spaced_mc_boundaries
from marlhf.macro.config import MacroConfig
from marlhf.macro.segments import build_segments
from marlhf.stages.ppo.config import GenerationConfig, PerfConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.experience import Experience
from marlhf.stages.ppo.mc import mc_boundaries
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.update import Minibatch, actor_step, minibatches
from tests.support.engine_stub import LogitsActor


def _experience(B=2, P=2, A=5, V=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = P + A
    seq = torch.randint(0, V, (B, T), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
    att = torch.cat([torch.ones(B, P).bool(), mask], 1)
    ro = Rollout(seq, att, torch.full((B,), P), seq[:, P:], mask, torch.ones(B).bool(), ["a", "b"])
    ids = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, -1, -1]])
    exp = Experience(
        ro, -torch.rand(B, A, generator=g) - 1, -torch.rand(B, A, generator=g) - 1,
        torch.zeros(B, A), torch.zeros(B), torch.zeros(B, A), torch.zeros(B, A), ids,
        torch.zeros(B, A), torch.zeros(B).bool(), advantages=torch.randn(B, A, generator=g),
    )  # fmt: skip
    return exp, seq, mask, T, V, P


def test_boundary_credit_trains_the_boundary_tokens_only():
    exp, seq, mask, T, V, P = _experience()
    # the first token of every macro action (fixed rule): tokens 0, 2, 4 and 0, 1
    exp.credit = torch.tensor([[1, 0, 1, 0, 1], [1, 1, 0, 0, 0]]).bool()
    cfg = PPOStageConfig(
        generation=GenerationConfig(max_answer_seq_len=5, temperature=1.0),
        ppo=PPOConfig(cliprange=0.2),
        macro=MacroConfig(macro_credit="boundary"),
        perf=PerfConfig(score_all_positions=True),
    )
    ms = list(minibatches(exp, PPOConfig(per_device_training_batch_size=2),
                          torch.Generator().manual_seed(0)))  # fmt: skip
    assert len(ms) == 1 and int(ms[0].num_terms) == 5 and int(ms[0].num_tokens) == 8
    actor = LogitsActor(T, V)
    m = Minibatch(
        idx=torch.arange(2),
        rollout=exp.rollout,
        num_tokens=mask.sum(),
        num_terms=exp.credit.sum(),
        world=1,
        num_seqs=torch.tensor(2),
    )
    stats = actor_step(SimpleNamespace(actor=actor), exp, m, cfg.trainer)
    logp = torch.log_softmax(actor.logits[0].detach(), -1)
    terms = []
    for b in range(2):
        for t in range(5):
            if exp.credit[b, t]:
                ratio = math.exp(
                    float(logp[P - 1 + t, seq[b, P + t]]) - float(exp.old_logprobs[b, t])
                )
                a = float(exp.advantages[b, t])
                terms.append(max(-a * ratio, -a * min(max(ratio, 0.8), 1.2)))
    assert float(stats["loss/policy"]) == pytest.approx(sum(terms) / len(terms), abs=1e-5)


@pytest.mark.parametrize(
    "ppo, match",
    [
        (
            PPOConfig(advantage_estimator="grpo", n_samples_per_prompt=2, reward_source="gold"),
            "gae or macro_mc",
        ),
        (PPOConfig(ratio_level="macro"), "--ratio_level token"),
    ],
)
def test_boundary_credit_rejects_per_response_estimators_and_macro_ratios(ppo, match):
    with pytest.raises(ValueError, match=match):
        PPOStageConfig(ppo=ppo, macro=MacroConfig(macro_credit="boundary"))
    PPOStageConfig(ppo=ppo)  # the default credit is valid with either


def loop_spaced(macro_end_row, length, C, spacing):
    starts = [0] + [t + 1 for t in range(length - 1) if macro_end_row[t]]
    chosen = []
    for i in range(1, C + 1):
        k = next((k for k, s in enumerate(starts) if k >= 1 and s >= i * spacing), None)
        if k is not None and k not in chosen:
            chosen.append(k)
    return chosen, starts


@pytest.mark.parametrize("C, spacing", [(0, 3), (1, 1), (2, 3), (4, 2), (6, 5), (3, 40)])
def test_spaced_mc_boundaries_match_loop(C, spacing):
    g = torch.Generator().manual_seed(C * 7 + spacing)
    B, A = 9, 16
    lengths = torch.randint(0, A + 1, (B,), generator=g)
    lengths[:3] = torch.tensor([A, 1, 0])
    mask = torch.arange(A)[None, :] < lengths[:, None]
    ends = (torch.rand(B, A, generator=g) < 0.4) | (torch.arange(A) == (lengths - 1)[:, None])
    b = select_spaced_mc_boundaries(build_segments(ends & mask, mask), C, spacing)
    for row in range(B):
        ks, starts = loop_spaced((ends & mask)[row].tolist(), int(lengths[row]), C, spacing)
        n = len(ks)
        width = b.mask.shape[1]
        assert b.mask[row].tolist() == [True] * n + [False] * (width - n)
        assert b.macro_index[row, :n].tolist() == ks
        assert b.positions[row, :n].tolist() == [starts[k] for k in ks]


def test_mc_boundaries_follow_the_selection_flag():
    ends = torch.ones(1, 12).bool()  # 12 one-token macro actions
    seg = build_segments(ends, torch.ones(1, 12).bool())
    spread = mc_boundaries(seg, PPOConfig(mc_max_boundaries=2, mc_boundary_selection="spread"), 99)
    assert spread.positions.tolist() == [[4, 8]]  # over the response's own 12 macro actions
    auto = mc_boundaries(seg, PPOConfig(mc_max_boundaries=2), 30)  # every ceil(30 / 3) = 10 tokens
    assert auto.positions.tolist() == [[10]]
    fixed = mc_boundaries(seg, PPOConfig(mc_max_boundaries=2, mc_boundary_spacing=3), 30)
    assert fixed.positions.tolist() == [[3, 6]]
    with pytest.raises(ValueError, match="--mc_boundary_selection"):
        PPOConfig(mc_boundary_selection="even")
