"""The fast paths of a PPO step give the reference path's results for the same seed.

The default step takes log π_old and its entropy from the static decoder (which records them while
sampling), applies the LM head at the response positions only, runs plain causal attention over
the flush-left rows and runs rows of similar length together (``marlhf.runtime.length_groups``).
``--recompute_old_logprobs --score_all_positions`` is the reference path: a second actor forward
pass for log π_old, the LM head at every position and the padding mask in the attention (the whole
computation, nothing reused or skipped). Both run the real stage (``tests/support/ppo_record.py``
records every step) for two PPO steps with the same seed, sampling at temperature 1 from the whole
vocabulary, with token-level PPO (n=1), 5-gram macro actions (n=5) and n=5 under ZeRO-3; the
reference is the recorded run of the reference path made in the same test. Checked: the same
responses at both steps (so the update of step 1 did not move the sampling), experience within
2e-5, the same update statistics (losses, ratios) and logged metrics, and weights that agree far
below the size of the two updates. And the reused log π_old is exact: at step 1 the first
minibatch's ratio π/π_old, with π the initial actor teacher-forced on the recorded sequences, is 1
within 1e-5 on every token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from marlhf.runtime.tracking import read_metrics
from tests.support.ppo_weights import assert_same_update, initial_weights, saved_weights
from tests.support.stage_env import run_stage

RECORD = Path(__file__).resolve().parents[2] / "support" / "ppo_record.py"
pytestmark = pytest.mark.slow

REFERENCE = ("--recompute_old_logprobs", "--score_all_positions")
CASES = {
    "n1": ("--termination_condition", "fixed", "--ngram", "1"),
    "n5": ("--termination_condition", "fixed", "--ngram", "5"),
    "zero3": (
        "--termination_condition", "fixed", "--ngram", "5",
        "--actor_zero_stage", "3", "--critic_zero_stage", "3",
    ),
}  # fmt: skip
FLAGS = (
    "--generation_backend", "static", "--temperature", "1.0", "--top_k", "0",
    "--max_prompt_seq_len", "160", "--max_answer_seq_len", "14",
    "--per_device_generation_batch_size", "6", "--per_device_training_batch_size", "3",
    "--ppo_epochs", "2", "--entropy_coef", "0.01", "--whiten_advantages",
    "--actor_learning_rate", "1e-4", "--critic_learning_rate", "1e-4",
    "--max_steps", "2", "--seed", "7", "--disable_progress_bar",
    # every split that saves padding is taken (the default weighs it against a pass's cost), so
    # the score passes and minibatches run in several length groups (the reference: one pass)
    "--length_group_call_tokens", "0",
)  # fmt: skip
EXPERIENCE = ("old_logprobs", "ref_logprobs", "values", "rewards", "advantages", "returns")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The tiny policy with its EOS made likely (so rows stop at different lengths and the
    batches are right-padded) and a reward model on it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("ppo_fast")
    actor = build_tiny(base / "actor")
    tok = AutoTokenizer.from_pretrained(actor)
    model = AutoModelForCausalLM.from_pretrained(actor, dtype=torch.float32)
    with torch.no_grad():  # tied embeddings: the EOS logit becomes h·e ≈ 2.5 for a typical h
        ids = torch.randint(
            5, model.config.vocab_size, (8, 40), generator=torch.Generator().manual_seed(0)
        )
        h = model.model(input_ids=ids).last_hidden_state.flatten(0, 1).mean(0)
        model.get_input_embeddings().weight[tok.eos_token_id] = h * 2.5 / h.norm() ** 2
    model.save_pretrained(actor)
    torch.manual_seed(0)
    save_reward_model(
        RewardModel.from_pretrained(actor), tok, base / "rm", score_stats={"mean": 0.0, "std": 1.0}
    )
    return base


@pytest.fixture(scope="module", params=list(CASES))
def runs(models, request):
    """(models' dir, fast run, reference run, case): the real stage, recorded, both paths."""
    base, case = models, request.param
    common = (
        "--actor_model_name_or_path", str(base / "actor"),
        "--critic_model_name_or_path", str(base / "rm"),
        "--data_output_path", str(base / "cache"), *CASES[case], *FLAGS,
    )  # fmt: skip
    fast, ref = base / case / "fast", base / case / "reference"
    home = base / "home"
    for out, extra in ((fast, ()), (ref, REFERENCE)):
        run_stage([sys.executable, str(RECORD), *common, *extra, "--output_dir", str(out)], home)
    return base, fast, ref, case


def _record(out: Path, step: int) -> dict:
    return torch.load(out / "record" / f"step-{step}-rank-0.pt", weights_only=False)


@pytest.mark.parametrize("step", [1, 2])
def test_same_rollouts_experience_and_update(runs, step):
    _, fast, ref, _ = runs
    got, want = _record(fast, step), _record(ref, step)
    assert got["prompt_ids"] == want["prompt_ids"]
    assert torch.equal(got["response_ids"], want["response_ids"])
    assert torch.equal(got["action_mask"], want["action_mask"])
    assert torch.equal(got["segment_ids"], want["segment_ids"])
    assert got["minibatch_rows"] == want["minibatch_rows"]
    # the rows stop at different lengths: the batches are right-padded
    assert len(set(want["action_mask"].sum(1).tolist())) > 1
    valid = want["action_mask"]
    for k in EXPERIENCE:
        x, y = got[k][valid], want[k][valid]  # padding holds anything
        torch.testing.assert_close(x, y, rtol=0, atol=2e-5, msg=lambda m, k=k: f"{step} {k}: {m}")
    torch.testing.assert_close(got["scores"], want["scores"], rtol=0, atol=2e-5)
    for stats in ("stats", "update"):
        assert set(got[stats]) == set(want[stats])
        for k, v in want[stats].items():
            assert got[stats][k] == pytest.approx(v, rel=1e-4, abs=2e-6), (step, stats, k)


def test_reused_old_logprobs_give_ratio_one(runs):
    """The first minibatch's ratio: the initial actor, teacher-forced on step 1's recorded
    sequences (an independent forward pass), against the reused log π_old, every valid token."""
    from transformers import AutoModelForCausalLM

    from marlhf.models.logprobs import token_logprobs

    base, fast, _, _ = runs
    rec = _record(fast, 1)
    model = AutoModelForCausalLM.from_pretrained(base / "actor", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(
            input_ids=rec["sequences"], attention_mask=rec["attention_mask"].long()
        ).logits
    A = rec["response_ids"].shape[1]
    at = (rec["response_start"][:, None] + torch.arange(A) - 1).clamp_max(logits.shape[1] - 2)
    sel = logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))
    logp = token_logprobs(sel, rec["response_ids"], temperature=1.0)
    ratio = torch.exp(logp - rec["old_logprobs"])[rec["action_mask"]]
    assert (ratio - 1).abs().max() < 1e-5


def test_same_weights_and_metrics(runs):
    base, fast, ref, _ = runs
    assert_same_update(initial_weights(base), saved_weights(ref), saved_weights(fast), rel=1e-2)
    a, b = read_metrics(ref / "metrics.jsonl"), read_metrics(fast / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y)
        for k in x:
            # rollout/*: float rounding of the decoder against each path's forward (~1e-6)
            abs_tol = 1e-5 if k.startswith("rollout/") else 2e-6
            if not k.startswith("time/"):
                assert y[k] == pytest.approx(x[k], rel=1e-4, abs=abs_tol), (x["step"], k)


@pytest.fixture(scope="module")
def reuse_runs(models) -> tuple[Path, Path, Path]:
    """n = 5 with the first minibatch's critic pass taken from scoring (the default) and without."""
    base = models
    common = (
        "--actor_model_name_or_path", str(base / "actor"),
        "--critic_model_name_or_path", str(base / "rm"),
        "--data_output_path", str(base / "cache"), *CASES["n5"], *FLAGS,
    )  # fmt: skip
    reused, recomputed = base / "reuse" / "reused", base / "reuse" / "recomputed"
    home = base / "home"
    for out, extra in ((reused, ()), (recomputed, ("--no_reuse_critic_forward",))):
        run_stage([sys.executable, str(RECORD), *common, *extra, "--output_dir", str(out)], home)
    return base, reused, recomputed


def test_reused_critic_forward_saves_one_pass_and_changes_nothing(reuse_runs):
    """``--reuse_critic_forward`` (default): the first minibatch's critic rows go through the critic
    once per step instead of twice, and the run is the recomputing run's up to float rounding."""
    base, reused, recomputed = reuse_runs
    minibatch = int(FLAGS[FLAGS.index("--per_device_training_batch_size") + 1])
    for step in (1, 2):
        got, want = _record(reused, step), _record(recomputed, step)
        assert want["critic_rows"] - got["critic_rows"] == minibatch, step
        assert torch.equal(got["response_ids"], want["response_ids"])
        assert got["minibatch_rows"] == want["minibatch_rows"]
        valid = want["action_mask"]
        for k in EXPERIENCE:
            torch.testing.assert_close(got[k][valid], want[k][valid], rtol=0, atol=2e-5)
        for k, v in want["update"].items():
            assert got["update"][k] == pytest.approx(v, rel=1e-4, abs=2e-6), (step, k)
    assert_same_update(
        initial_weights(base), saved_weights(recomputed), saved_weights(reused), rel=1e-2
    )
