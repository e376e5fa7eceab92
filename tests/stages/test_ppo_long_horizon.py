"""A short PPO run with the oracle reward raises the gold score of ``tiny-base-256`` on the longest task.

``python -m marlhf.stages.ppo --reward_source gold --data_path synthetic-facts-256`` (a real stage
process) from the shipped base, with a critic on the base's backbone (fresh value head: there is no
reward-model stage with the oracle). The gold score of ``marlhf.data.long_tasks.facts_gold``, which the
stage finds from the data path, is the reward; quality is then measured independently on held-out
prompts at the policy's sampling temperature (1).

FIGURES
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from stage_env import stage_env as _env

from marlhf.data.long_tasks import N_TRAIN, facts_gold, generate
from marlhf.data.synthetic import prompt_of
from marlhf.models import resolve_model_path
from marlhf.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
STEPS = 20
FLAGS = [
    "--data_path", "synthetic-facts-256",
    "--max_prompt_seq_len", "400",
    "--max_answer_seq_len", "288",
    "--per_device_generation_batch_size", "8",
    "--per_device_training_batch_size", "8",
    "--actor_learning_rate", "1e-4",
    "--critic_learning_rate", "5e-4",
    "--kl_ctl", "0.05",
    "--temperature", "1.0",
    "--top_k", "0",
    "--ppo_epochs", "1",
    "--lr_scheduler_type", "constant",
    "--reward_source", "gold",
    "--seed", "1234",
    "--disable_progress_bar",
]  # fmt: skip


def _critic(out: Path) -> Path:
    """A critic directory: the base's backbone with a fresh value head (no RM stage with the oracle)."""
    from transformers import AutoTokenizer

    from marlhf.reward_model import RewardModel, save_reward_model

    base = resolve_model_path("tiny-base-256")
    torch.manual_seed(0)
    model = RewardModel.from_pretrained(base, dtype=torch.float32)
    save_reward_model(model, AutoTokenizer.from_pretrained(base), out)
    return out


def _gold_at_t1(model_dir: str, prompts: list[str]) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.tiny import generate_answers

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    answers, _, _ = generate_answers(model, tok, prompts, 288, 1.0)
    return sum(facts_gold(p, a) for p, a in zip(prompts, answers, strict=True)) / len(prompts)


def test_oracle_ppo_raises_gold_on_the_256_token_task(tmp_path):
    home, out = tmp_path / "home", tmp_path / "ppo"
    cmd = [sys.executable, "-m", "marlhf.stages.ppo", *FLAGS]
    cmd += ["--actor_model_name_or_path", "tiny-base-256"]
    cmd += ["--critic_model_name_or_path", str(_critic(tmp_path / "critic"))]
    cmd += ["--data_output_path", str(tmp_path / "cache"), "--output_dir", str(out)]
    cmd += ["--max_steps", str(STEPS)]
    proc = subprocess.run(
        cmd, env=_env(home), cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "objective/score" in r]
    assert len(rows) == STEPS
    # the oracle's score is the logged gold of the rollouts
    assert all(abs(r["objective/score"] - r["objective/gold"]) < 1e-5 for r in rows)

    prompts = [prompt_of(r) for r in generate("synthetic-facts-256", 32, 0, "valid1", N_TRAIN)]
    before = _gold_at_t1(resolve_model_path("tiny-base-256"), prompts)
    after = _gold_at_t1(str(out / "actor"), prompts)
    print(f"held-out gold at T=1: base {before:.3f} -> PPO {after:.3f}")
    assert after > before + 0.1, (before, after)
