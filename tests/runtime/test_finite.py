"""Non-finite numbers stop a run before the optimizer step (``marlhf.runtime.finite``): rewards, values,
advantages and losses, gradients at the accumulation boundary, and never saved weights; end to end
with a reward model and critic whose value head is NaN (PPO, gae and grpo) and an SFT model whose
loss is NaN."""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path

import pytest
import torch

import marlhf.runtime.finite as finite
from marlhf.runtime.finite import NonFiniteError, check_finite, describe_nonfinite, guarded_step
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


def test_doctests():
    assert doctest.testmod(finite).failed == 0


def test_describe_counts_each_kind():
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), float("nan")])
    assert describe_nonfinite(x) == "2 nan and 1 +inf and 1 -inf among its 5 values"
    assert describe_nonfinite(torch.arange(3)) is None  # integers are always finite
    assert describe_nonfinite(0.5) is None
    with pytest.raises(NonFiniteError, match=r"^step 7: the advantages is not finite \(1 nan"):
        check_finite(7, {"rewards": torch.zeros(2), "the advantages": torch.tensor([float("nan")])})


class _Engine:
    """What ``guarded_step`` reads of a DeepSpeed engine, around a real module."""

    def __init__(self, gas: int = 1, zero: bool = False, applied: bool = True):
        self.module = torch.nn.Linear(2, 1)
        self.gas, self.micro, self.zero, self.applied = gas, 0, zero, applied
        self.optimizer_steps = 0

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro + 1) % self.gas == 0

    def zero_optimization(self) -> bool:
        return self.zero

    def fp16_enabled(self) -> bool:
        return False

    def get_global_grad_norm(self):
        return None

    def step(self) -> None:
        if self.is_gradient_accumulation_boundary():
            self.optimizer_steps += 1
            self._step_applied = self.applied
        self.micro += 1


def _backward(engine: _Engine, scale: float) -> torch.Tensor:
    loss = engine.module(torch.ones(1, 2)).sum() * scale
    loss.backward()
    return loss


def test_a_non_finite_loss_of_any_micro_batch_stops_before_the_optimizer_step():
    engine = _Engine(gas=2)
    guarded_step(engine, 5, "model", _backward(engine, float("nan")))  # micro-batch 1 of 2
    assert engine.optimizer_steps == 0
    with pytest.raises(NonFiniteError, match=r"^step 5: the model's loss is not finite \(1 nan"):
        guarded_step(engine, 5, "model", _backward(engine, 1.0))
    assert engine.optimizer_steps == 0  # the update was not applied


def test_non_finite_gradients_with_a_finite_loss_stop_too():
    engine = _Engine()
    loss = _backward(engine, 1.0)
    engine.module.weight.grad[0, 1] = float("inf")
    with pytest.raises(NonFiniteError, match="step 2: the actor's gradient norm is not finite"):
        guarded_step(engine, 2, "actor", loss)
    assert engine.optimizer_steps == 0
    # ZeRO keeps the gradients in its partitions and skips a non-finite update itself: reported
    skipped = _Engine(zero=True, applied=False)
    with pytest.raises(NonFiniteError, match="step 3: the critic's gradient norm"):
        guarded_step(skipped, 3, "critic", _backward(skipped, 1.0))
    fine = _Engine()
    guarded_step(fine, 1, "model", _backward(fine, 1.0))
    assert fine.optimizer_steps == 1


# --- end to end ----------------------------------------------------------------------------------
def _errors(proc) -> list[str]:
    return [x for x in proc.stderr.splitlines() if x.startswith("error:")]


@pytest.fixture(scope="module")
def nan_models(tmp_path_factory):
    """The tiny policy, a reward model on it whose value head is NaN, and the policy with a NaN
    in its LM head (an SFT loss of NaN)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("nan")
    actor = Path(build_tiny(base / "actor"))
    rm = RewardModel.from_pretrained(actor)
    with torch.no_grad():
        rm.v_head.weight.fill_(float("nan"))
    save_reward_model(
        rm, AutoTokenizer.from_pretrained(actor), base / "rm", score_stats={"mean": 0.0, "std": 1.0}
    )
    broken = base / "broken"
    import shutil

    shutil.copytree(actor, broken)
    weights = load_file(str(broken / "model.safetensors"))
    key = next(k for k in weights if "norm" in k)  # a final norm weight: every logit turns NaN
    weights[key] = torch.full_like(weights[key], float("nan"))
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    return base, actor, base / "rm", broken


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_ppo_with_a_nan_reward_model_stops_at_step_1_and_saves_nothing(nan_models, estimator):
    base, actor, rm, _ = nan_models
    out = base / f"ppo_{estimator}"
    cmd = [sys.executable, "-m", "marlhf.stages.ppo", "--actor_model_name_or_path", str(actor)]
    cmd += ["--critic_model_name_or_path", str(rm), "--advantage_estimator", estimator]
    cmd += ["--n_samples_per_prompt", "2", "--max_steps", "2", "--save_steps", "1"]
    cmd += ["--max_prompt_seq_len", "160", "--max_answer_seq_len", "8"]
    cmd += ["--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2"]
    cmd += ["--data_output_path", str(base / "cache"), "--output_dir", str(out)]
    proc = run_python(
        [*cmd, "--disable_progress_bar"], env=stage_env(base / "home"), capture_output=True,
        text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = _errors(proc)
    assert line.startswith("error: step 1: the sequence reward (objective/score) is not finite")
    assert "Traceback" not in proc.stderr
    assert not (out / "actor").exists() and not (out / "checkpoints").exists()
    assert not (out / "train_state").exists()
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "what"), [("sft", "model"), ("reward", "reward model")])
def test_supervised_stages_with_a_nan_loss_stop_at_step_1_and_save_nothing(nan_models, stage, what):
    base, _, _, broken = nan_models
    out = base / stage
    cmd = [sys.executable, "-m", f"marlhf.stages.{stage}", "--model_name_or_path", str(broken)]
    cmd += ["--max_samples", "40", "--max_steps", "2", "--save_steps", "1"]
    cmd += ["--data_output_path", str(base / "cache"), "--output_dir", str(out)]
    proc = run_python(
        [*cmd, "--disable_progress_bar"], env=stage_env(base / "home"), capture_output=True,
        text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = _errors(proc)
    assert line.startswith(f"error: step 1: the {what}'s loss is not finite"), line
    assert not (out / "model.safetensors").exists() and not (out / "train_state").exists()
    assert not (out / "checkpoints").exists()
    assert json.loads((out / "run_config.json").read_text())["optim"]["max_steps"] == 2
