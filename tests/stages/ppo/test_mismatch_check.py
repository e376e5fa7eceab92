"""The trainer's side of the rollout–trainer mismatch: π_old's source (the static decoder's record
or the trainer's own score, `marlhf.stages.ppo.scoring.old_policy`), the check on the record (fp32:
near 0, a correction that changes nothing; a planted perturbation of the record is read back), the
check steps and the correction's default per dtype and validation."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from marlhf.algo.losses import policy_loss
from marlhf.algo.mismatch import importance_weights, mismatch_metrics
from marlhf.cli import parse_config
from marlhf.models.decode import sample
from marlhf.models.sequences import pack_flush_left, response_mask
from marlhf.models.zoo import build_tiny
from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.loop import mismatch_check_step
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.scoring import old_policy
from tests.support.engine_stub import Engine


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The tiny actor, a rollout sampled by the static decoder (with its record) in fp32."""
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
    return parse_config(PPOStageConfig, list(flags))


def test_fp32_check_is_near_zero_and_tis_changes_nothing(recorded):
    actor, ro = recorded
    cfg = _cfg("--rollout_correction", "tis")
    with torch.no_grad():
        old = old_policy(actor, ro, cfg.trainer, check_rollout=False, groups=None)
    mask = ro.action_mask
    assert old.logprobs is old.trainer_logprobs  # π_old: the trainer's score
    m = mismatch_metrics(old.trainer_logprobs, old.rollout_logprobs, mask)
    # measured 2e-7 mean, 2e-6 max (fp32 rounding of the one-token steps against the full pass)
    assert m["rollout/logprob_diff_mean"] < 1e-5 and m["rollout/logprob_diff_max"] < 1e-4
    assert m["rollout/k3_kl"] < 1e-9
    w = importance_weights(
        old.trainer_logprobs, ro.logprobs, mask, mode="tis", cap=2.0, level="sequence"
    )
    torch.testing.assert_close(w[mask], torch.ones(int(mask.sum())), rtol=0, atol=1e-4)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    logp = old.logprobs + 0.1 * torch.randn(mask.shape)
    plain, _ = policy_loss(logp, old.logprobs, adv, mask, cliprange=0.2)
    corrected, _ = policy_loss(logp, old.logprobs, adv, mask, cliprange=0.2, is_weights=w)
    assert float(corrected) == pytest.approx(float(plain), rel=1e-4, abs=1e-6)


def test_pi_old_source_and_the_check(recorded):
    actor, ro = recorded
    none = _cfg("--rollout_correction", "none")
    plain = old_policy(actor, ro, none.trainer, check_rollout=False, groups=None)
    assert plain.logprobs is ro.logprobs and plain.trainer_logprobs is None
    checked = old_policy(actor, ro, none.trainer, check_rollout=True, groups=None)
    assert checked.logprobs is ro.logprobs  # the check changes nothing it trains with
    assert checked.entropy is ro.entropy
    assert checked.trainer_logprobs is not None and checked.rollout_logprobs is ro.logprobs
    # a planted perturbation of the record: the metric reads it back
    shifted = torch.where(ro.action_mask, ro.logprobs - 0.3, ro.logprobs)
    ro2 = type(ro)(**{**ro.__dict__, "logprobs": shifted})
    out = old_policy(actor, ro2, _cfg("--rollout_correction", "mis").trainer, False, None)
    m = mismatch_metrics(out.trainer_logprobs, out.rollout_logprobs, ro.action_mask)
    assert m["rollout/logprob_diff_mean"] == pytest.approx(0.3, abs=1e-4)
    assert m["rollout/ratio_min_token"] == pytest.approx(math.exp(0.3), rel=1e-4)


def test_defaults_per_dtype_and_validation():
    assert _cfg().correction == "none"
    assert _cfg("--dtype", "bf16").correction == "tis"
    assert _cfg("--bf16").correction == "tis"
    assert _cfg("--dtype", "bf16", "--rollout_correction", "none").correction == "none"
    cfg = _cfg("--mismatch_check_every", "3")
    assert [s for s in range(10) if mismatch_check_step(cfg.perf, s)] == [0, 3, 6, 9]
    assert not any(
        mismatch_check_step(_cfg("--mismatch_check_every", "0").perf, s) for s in range(5)
    )
    with pytest.raises(ValueError, match="--rollout_is_cap"):
        PPOConfig(rollout_is_cap=1.0)
    with pytest.raises(ValueError, match="--rollout_correction"):
        PPOConfig(rollout_correction="icepop")
    with pytest.raises(ValueError, match="generation_backend hf"):
        PPOStageConfig(
            generation=GenerationConfig(generation_backend="hf"),
            ppo=PPOConfig(rollout_correction="tis"),
        )


def test_a_record_without_entropies_is_the_behaviour_policy(recorded):
    """vLLM's record (log-probs, no entropies): π_old and its entropy are the trainer's on every
    step, and the record is returned beside them on every step, check step or not, for the
    rollout/* metrics and the correction."""
    actor, ro = recorded
    shifted = torch.where(ro.action_mask, ro.logprobs - 0.2, ro.logprobs)
    vllm_like = type(ro)(**{**ro.__dict__, "logprobs": shifted, "entropy": None})
    for mode in ("none", "tis"):
        with torch.no_grad():
            out = old_policy(
                actor, vllm_like, _cfg("--rollout_correction", mode).trainer, False, None
            )
        assert out.logprobs is out.trainer_logprobs and out.rollout_logprobs is shifted
        torch.testing.assert_close(out.logprobs, ro.logprobs, rtol=0, atol=1e-4)  # the actor's
        torch.testing.assert_close(out.entropy, ro.entropy, rtol=0, atol=1e-4)
    m = mismatch_metrics(out.trainer_logprobs, out.rollout_logprobs, ro.action_mask)
    assert m["rollout/logprob_diff_mean"] == pytest.approx(0.2, abs=1e-4)
    w = importance_weights(out.trainer_logprobs, shifted, ro.action_mask, mode="tis", cap=1.1)
    mask = ro.action_mask
    assert torch.equal(w[mask], torch.full((int(mask.sum()),), 1.1))  # ρ = e^0.2 > 1.1: truncated
