"""Rollout–trainer mismatch: metrics and importance weights against loops over rows and terms, the
trainer's check on the static decoder's record (fp32: near 0, a correction that changes nothing; a
planted perturbation of the record gives the formula's weights), and where π_old comes from."""

import math

import pytest
import torch
from engine_stub import Engine

from marlhf.rl.config import PPOStageConfig
from marlhf.rl.losses import policy_loss
from marlhf.rl.mismatch import CORRECTIONS, importance_weights, mismatch_metrics


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


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The tiny actor, a rollout sampled by the static decoder (with its record) in fp32."""
    from transformers import AutoModelForCausalLM

    from marlhf.decode import sample
    from marlhf.rl.rollout import Rollout, pack_flush_left, response_mask
    from marlhf.tiny import build_tiny

    path = build_tiny(tmp_path_factory.mktemp("tiny") / "actor")
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(5, 200, (4, 9), generator=g)
    pmask = torch.ones_like(prompts)
    pmask[1, :3] = 0
    prompts[1, :3] = 0
    ids, logp, ent = sample(
        actor, prompts, pmask, max_new_tokens=10, temperature=0.8, top_k=0, eos_ids=[2],
        pad_id=0, row_seeds=torch.arange(4) + 7, return_logprobs=True,
    )  # fmt: skip
    mask, ends = response_mask(ids, [2])
    seq, att, start = pack_flush_left(prompts, pmask, ids, mask, pad_id=0)
    ro = Rollout(seq, att, start, ids, mask, ends, list("abcd"), logp * mask, ent * mask)
    return Engine(actor), ro


def _cfg(*flags):
    from marlhf.cli import parse_config

    return parse_config(PPOStageConfig, list(flags))


def test_fp32_check_is_near_zero_and_tis_changes_nothing(recorded):
    from marlhf.rl.scoring import old_policy

    actor, ro = recorded
    cfg = _cfg("--rollout_correction", "tis")
    with torch.no_grad():
        old = old_policy(actor, ro, cfg, check_rollout=False, groups=None)
    mask = ro.action_mask
    assert old["old_logprobs"] is old["trainer_logprobs"]  # π_old: the trainer's score
    m = mismatch_metrics(old["trainer_logprobs"], old["rollout_logprobs"], mask)
    # measured 2e-7 mean, 2e-6 max (fp32 rounding of the one-token steps against the full pass)
    assert m["rollout/logprob_diff_mean"] < 1e-5 and m["rollout/logprob_diff_max"] < 1e-4
    assert m["rollout/k3_kl"] < 1e-9
    w = importance_weights(
        old["trainer_logprobs"], ro.logprobs, mask, mode="tis", cap=2.0, level="sequence"
    )
    torch.testing.assert_close(w[mask], torch.ones(int(mask.sum())), rtol=0, atol=1e-4)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    logp = old["old_logprobs"] + 0.1 * torch.randn(mask.shape)
    plain, _ = policy_loss(logp, old["old_logprobs"], adv, mask, cliprange=0.2)
    corrected, _ = policy_loss(logp, old["old_logprobs"], adv, mask, cliprange=0.2, is_weights=w)
    assert float(corrected) == pytest.approx(float(plain), rel=1e-4, abs=1e-6)


def test_pi_old_source_and_the_check(recorded):
    from marlhf.rl.scoring import old_policy

    actor, ro = recorded
    none = _cfg("--rollout_correction", "none")
    plain = old_policy(actor, ro, none, check_rollout=False, groups=None)
    assert plain["old_logprobs"] is ro.logprobs and plain["trainer_logprobs"] is None
    checked = old_policy(actor, ro, none, check_rollout=True, groups=None)
    assert checked["old_logprobs"] is ro.logprobs  # the check changes nothing it trains with
    assert checked["entropy"] is ro.entropy
    assert checked["trainer_logprobs"] is not None and checked["rollout_logprobs"] is ro.logprobs
    # a planted perturbation of the record: the metric reads it back
    shifted = torch.where(ro.action_mask, ro.logprobs - 0.3, ro.logprobs)
    ro2 = type(ro)(**{**ro.__dict__, "logprobs": shifted})
    out = old_policy(actor, ro2, _cfg("--rollout_correction", "mis"), False, None)
    m = mismatch_metrics(out["trainer_logprobs"], out["rollout_logprobs"], ro.action_mask)
    assert m["rollout/logprob_diff_mean"] == pytest.approx(0.3, abs=1e-4)
    assert m["rollout/ratio_min_token"] == pytest.approx(math.exp(0.3), rel=1e-4)


def test_defaults_per_dtype_and_validation():
    from marlhf.rl.loop import mismatch_check_step

    assert _cfg().correction == "none"
    assert _cfg("--dtype", "bf16").correction == "tis"
    assert _cfg("--bf16").correction == "tis"
    assert _cfg("--dtype", "bf16", "--rollout_correction", "none").correction == "none"
    cfg = _cfg("--mismatch_check_every", "3")
    assert [s for s in range(10) if mismatch_check_step(cfg, s)] == [0, 3, 6, 9]
    assert not any(mismatch_check_step(_cfg("--mismatch_check_every", "0"), s) for s in range(5))
    from marlhf.rl.config import GenerationConfig, PPOConfig

    with pytest.raises(ValueError, match="--rollout_is_cap"):
        PPOConfig(rollout_is_cap=1.0)
    with pytest.raises(ValueError, match="--rollout_correction"):
        PPOConfig(rollout_correction="icepop")
    with pytest.raises(ValueError, match="generation_backend hf"):
        PPOStageConfig(
            generation=GenerationConfig(generation_backend="hf"),
            ppo=PPOConfig(rollout_correction="tis"),
        )
