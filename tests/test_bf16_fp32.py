"""Under ``--dtype bf16`` the models' weights and matmuls are bf16, and these places stay float32:
DeepSpeed's master weights and Adam moments, the log-softmax and entropy over the vocabulary, the
value and reward heads, GAE, advantage whitening and the KL penalty. One test per place: each feeds
bf16 inputs and compares with a float64 computation over the same (bf16) values. bf16 keeps 8
significant bits (relative rounding 2^-9 ≈ 2e-3); each tolerance below is float32's (≤ 1e-5
relative), so a place that silently computed in bf16 fails its test."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from marlhf.algo.gae import gae
from marlhf.algo.kl_rewards import kl_penalty
from marlhf.algo.losses import masked_whiten
from marlhf.models.logprobs import entropy_from_logits, token_logprobs
from marlhf.models.reward_model import RewardModel, end_scores
from marlhf.models.sequences import gather_response
from marlhf.models.zoo import build_tiny
from marlhf.stages.ppo.forward import critic_forward
from marlhf.stages.ppo.rollout import Rollout
from tests.support.forked import run_python

ROOT = Path(__file__).resolve().parents[1]
BF16 = torch.bfloat16


def _bf16(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(BF16)


@pytest.mark.slow  # a DeepSpeed process
def test_deepspeed_master_weights_and_adam_moments_are_fp32():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", MASTER_PORT=str(port))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = run_python(
        [sys.executable, str(Path(__file__).parent / "support" / "bf16_master_probe.py")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for stage in ("0", "1", "2", "3"):
        got = out[stage]
        assert got["module"] == ["torch.bfloat16"], (stage, got)  # the bf16 mode is on
        assert got["master"] == ["torch.float32"], (stage, got)
        assert got["moments"] == ["torch.float32"] and got["n_moments"] > 0, (stage, got)


def test_log_softmax_is_fp32():
    logits = _bf16(2, 5, 4000, scale=4.0)
    labels = torch.randint(0, 4000, (2, 5), generator=torch.Generator().manual_seed(1))
    got = token_logprobs(logits, labels, temperature=0.8)
    want = torch.log_softmax(logits.double() / 0.8, -1).gather(-1, labels[..., None])[..., 0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_entropy_is_fp32():
    logits = _bf16(2, 5, 4000, seed=2, scale=4.0)
    got = entropy_from_logits(logits, temperature=0.8)
    logp = torch.log_softmax(logits.double() / 0.8, -1)
    want = -(logp.exp() * logp).sum(-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def bf16_reward_model(tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp("tiny") / "actor")
    torch.manual_seed(0)
    return RewardModel.from_pretrained(path, dtype=BF16, init_std=1.0).eval()


class _Engine(torch.nn.Module):
    """What scoring uses of a DeepSpeed engine: ``module`` and the forward."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


def _head_reference(model, ids):
    """The head's product in float64 over the bf16 backbone's hidden states and weight."""
    with torch.no_grad():
        hidden = model.backbone(input_ids=ids, use_cache=False).last_hidden_state
        return hidden.double() @ model.v_head.weight.double()[0]


def test_value_head_is_fp32(bf16_reward_model):
    model = bf16_reward_model
    ids = torch.randint(5, 200, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 12, dtype=torch.bool)
    ro = Rollout(ids, mask, torch.tensor([4, 6]), ids[:, :6], mask[:, :6], mask[:, 0], ["a", "b"])
    with torch.no_grad():
        values = critic_forward(_Engine(model), ro)
    assert next(model.backbone.parameters()).dtype == BF16
    assert values.dtype == torch.float32
    want = gather_response(_head_reference(model, ids), ro.response_start, 6)
    torch.testing.assert_close(values.double(), want, rtol=1e-5, atol=1e-5)


def test_reward_head_is_fp32(bf16_reward_model):
    model = bf16_reward_model
    ids = torch.randint(5, 200, (3, 10), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        values = model(input_ids=ids, attention_mask=None)
    assert values.dtype == torch.float32
    want = _head_reference(model, ids)
    torch.testing.assert_close(end_scores(values, mask).double(), end_scores(want, mask))
    torch.testing.assert_close(values.double(), want, rtol=1e-5, atol=1e-5)


def _gae_loop(r, v, gamma, lam):
    adv, last, nxt = [0.0] * len(r), 0.0, 0.0
    for t in reversed(range(len(r))):
        last = r[t] + gamma * nxt - v[t] + gamma * lam * last
        adv[t], nxt = last, v[t]
    return adv


def test_gae_is_fp32():
    # values near 3 and small per-step rewards: bf16 spacing at 3 is 2^-6 ≈ 0.016
    values = (3.0 + _bf16(2, 40, seed=5, scale=0.1)).to(BF16)
    rewards = _bf16(2, 40, seed=6, scale=0.01)
    mask = torch.ones(2, 40, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    for b in range(2):
        want = _gae_loop(rewards[b].double().tolist(), values[b].double().tolist(), 1.0, 0.95)
        torch.testing.assert_close(adv[b].double(), torch.tensor(want, dtype=torch.float64),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


def test_whitening_is_fp32():
    x = (10.0 + _bf16(3, 50, seed=7)).to(BF16)  # mean 10: bf16 would centre at 2^-4 steps
    mask = torch.rand(3, 50, generator=torch.Generator().manual_seed(8)) < 0.8
    got = masked_whiten(x, mask)
    v = x.double()[mask]
    want = (v - v.mean()) / torch.sqrt(v.var() + 1e-8)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[mask].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_is_fp32(estimator):
    logp = (-5.0 + _bf16(4, 30, seed=9)).to(BF16)
    ref = logp.float() + torch.randn(4, 30, generator=torch.Generator().manual_seed(10)) * 0.01
    ref = ref.to(BF16)  # differences of a few 1e-2 between values near -5
    got = kl_penalty(logp, ref, estimator)
    d = logp.double() - ref.double()
    want = {"k1": d, "k2": 0.5 * d**2, "k3": torch.expm1(-d) + d}[estimator]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
