"""Rollout–trainer mismatch (`marlhf.algo.mismatch`): metrics and importance weights against loops
over rows and terms, on planted perturbations of the rollout's log-probs, and the weights in the
policy loss. The trainer's side (π_old's source, the check on the static decoder's record) is in
tests/stages/ppo/test_mismatch_check.py."""

import math

import pytest
import torch

from marlhf.algo.losses import policy_loss
from marlhf.algo.mismatch import CORRECTIONS, importance_weights, mismatch_metrics


def _batch(seed=0, B=4, A=7):
    g = torch.Generator().manual_seed(seed)
    trainer = -torch.rand(B, A, generator=g) * 3
    rollout = trainer + torch.randn(B, A, generator=g) * 0.4
    lengths = [7, 5, 1, 3]
    mask = torch.arange(A)[None] < torch.tensor(lengths)[:, None]
    # macro actions of 1–3 tokens
    seg = torch.full((B, A), -1)
    for b, n in enumerate(lengths):
        ids, k, t = [], 0, 0
        while t < n:
            size = int(torch.randint(1, 4, (1,), generator=g))
            ids += [k] * size
            t += size
            k += 1
        seg[b, :n] = torch.tensor(ids[:n])
    return trainer, rollout, mask, seg


def _terms(b, mask, seg, level):
    """The token sets of row b's policy-loss terms at ``level`` (a loop)."""
    n = int(mask[b].sum())
    if level == "token":
        return [[t] for t in range(n)]
    if level == "sequence":
        return [list(range(n))] if n else []
    groups: dict[int, list[int]] = {}
    for t in range(n):
        groups.setdefault(int(seg[b, t]), []).append(t)
    return list(groups.values())


def _expected_weight(trainer, rollout, b, tokens, level, mode, cap, n):
    logs = [float(trainer[b, t] - rollout[b, t]) for t in tokens]
    rho = math.exp(sum(logs) / len(logs) if level == "sequence" else sum(logs))
    all_logs = [float(trainer[b, t] - rollout[b, t]) for t in range(n)]
    geo = math.exp(sum(all_logs) / n)
    if mode == "none":
        return 1.0
    if mode == "tis":
        return min(rho, cap)
    if mode == "mis":
        return rho if 1 / cap <= rho <= cap else 0.0
    return min(rho, cap) if 1 / cap <= geo <= cap else 0.0


@pytest.mark.parametrize("mode", CORRECTIONS)
@pytest.mark.parametrize("level", ["token", "macro", "sequence"])
def test_weights_equal_the_formula_on_planted_perturbations(mode, level):
    trainer, rollout, mask, seg = _batch()
    cap = 1.3
    w = importance_weights(trainer, rollout, mask, mode=mode, cap=cap, level=level, segment_ids=seg)
    assert not w.requires_grad and w.dtype == torch.float32
    assert (w[~mask] == 0).all()
    for b in range(mask.shape[0]):
        n = int(mask[b].sum())
        for tokens in _terms(b, mask, seg, level):
            want = _expected_weight(trainer, rollout, b, tokens, level, mode, cap, n)
            for t in tokens:  # every token of a term carries its weight
                assert float(w[b, t]) == pytest.approx(want, rel=1e-5, abs=1e-7), (b, t)
    # the perturbations are large enough that every mode truncates or masks something
    if mode != "none":
        assert (w[mask] != 1.0).any()


def test_metrics_equal_loops():
    trainer, rollout, mask, seg = _batch(seed=3)
    m = mismatch_metrics(trainer, rollout, mask, seg)
    diffs, k3, tok, macro, seq = [], [], [], [], []
    for b in range(mask.shape[0]):
        n = int(mask[b].sum())
        row = [float(trainer[b, t]) - float(rollout[b, t]) for t in range(n)]
        diffs += [abs(d) for d in row]
        k3 += [math.exp(d) - 1 - d for d in row]
        tok += [math.exp(d) for d in row]
        for tokens in _terms(b, mask, seg, "macro"):
            macro.append(math.exp(sum(row[t] for t in tokens)))
        seq.append(math.exp(sum(row)))
    assert m["rollout/logprob_diff_mean"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-6)
    assert m["rollout/logprob_diff_max"] == pytest.approx(max(diffs), rel=1e-6)
    assert m["rollout/k3_kl"] == pytest.approx(sum(k3) / len(k3), rel=1e-5)
    for name, xs in (("token", tok), ("macro", macro), ("seq", seq)):
        assert m[f"rollout/ratio_min_{name}"] == pytest.approx(min(xs), rel=1e-5)
        assert m[f"rollout/ratio_max_{name}"] == pytest.approx(max(xs), rel=1e-5)


def test_weights_scale_each_policy_term():
    trainer, rollout, mask, seg = _batch(seed=5)
    adv = torch.randn(mask.shape)
    logp = trainer + 0.05
    w = importance_weights(trainer, rollout, mask, mode="tis", cap=1.2)
    got, _ = policy_loss(logp, trainer, adv, mask, cliprange=0.2, is_weights=w)
    ratio = torch.exp(logp - trainer)
    per = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    assert float(got) == pytest.approx(float((per * w)[mask].sum() / mask.sum()), rel=1e-6)
