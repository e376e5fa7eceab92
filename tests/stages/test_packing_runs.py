"""The stages run with packed rows and token-budget micro-batches as they run padded: SFT, the reward
model and PPO (tiny-base, three steps, answers that stop at EOS at different lengths), each the
real stage in a subprocess, compared step by step (losses, every logged metric) and by the weights
they save; PPO also under ZeRO-3 with LoRA adapters. The padded run with row-count micro-batches is
the reference; the others differ from it by float rounding only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from marlhf.runtime.tracking import read_metrics
from tests.support.ppo_weights import update_gap
from tests.support.short_prompts import write_short_tldr
from tests.support.stage_env import run_stage

pytestmark = pytest.mark.slow

PADDED = ("--no_packing",)


def _close(got: list[dict], want: list[dict], rel: float, abs_: float):
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(want, got, strict=True):
        assert set(a) == set(b)
        for k, v in a.items():
            timing = k.split("/")[0] in ("time", "time_cpu", "mem") or k.endswith("_time_s")
            if not timing and isinstance(v, float):
                assert b[k] == pytest.approx(v, rel=rel, abs=abs_), (a["step"], k)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The runs' directory, with the bundled TL;DR data cut to short posts (``short_tldr.jsonl``,
    :mod:`tests.support.short_prompts`): short rows share a packed bin with long ones (prompts of
    the bundled posts are 90–150 tokens: no two rows would share one)."""
    base = tmp_path_factory.mktemp("packing_runs")
    write_short_tldr(base / "short_tldr.jsonl")
    return base


def _data(home: Path) -> tuple[str, str]:
    return ("--data_path", f"synthetic-tldr:{home / 'short_tldr.jsonl'}")


def _stage(module: str, home: Path, out: Path, *flags: str) -> list[dict]:
    run_stage(
        [sys.executable, "-m", module, "--output_dir", str(out), "--data_output_path",
         str(home / "cache"), "--seed", "1234", "--disable_progress_bar", *_data(home), *flags],
        home / "home",
    )  # fmt: skip
    return read_metrics(out / "metrics.jsonl")


SFT = (
    "--model_name_or_path", "tiny-base", "--max_seq_len", "192", "--learning_rate", "1e-3",
    "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
    "--max_steps", "3", "--eval_interval", "3", "--eval_iters", "2",
)  # fmt: skip


def test_sft_packed_and_by_token_budget_equals_padded(home):
    from safetensors.torch import load_file

    # packed, the 2 x 4 rows of a step cut by 300 tokens: other micro-batches than the collator's
    runs = {"padded": PADDED, "budget": ("--max_tokens_per_micro_batch", "300")}
    metrics, weights = {}, {}
    for name, flags in runs.items():
        out = home / "sft" / name
        metrics[name] = _stage("marlhf.stages.sft", home, out, *SFT, *flags)
        weights[name] = load_file(str(out / "model.safetensors"))
    init = load_file(str(Path(_tiny_base(home)) / "model.safetensors"))
    _close(metrics["budget"], metrics["padded"], rel=1e-5, abs_=1e-6)
    assert update_gap(init, weights["padded"], weights["budget"]) < 1e-3


def _tiny_base(home: Path) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARLHF_HOME", str(home / "home"))
        from marlhf.models.zoo import ensure_tiny_base

        return ensure_tiny_base()


RM = (
    "--model_name_or_path", "tiny-base", "--max_seq_len", "192", "--learning_rate", "1e-3",
    "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
    "--per_device_eval_batch_size", "8", "--max_steps", "3", "--eval_interval", "3",
    "--eval_iters", "2",
)  # fmt: skip


def test_reward_model_packed_and_by_token_budget_equals_padded(home):
    from marlhf.models.reward_model import RewardModel, load_reward_model

    runs = {"padded": PADDED, "budget": ("--max_tokens_per_micro_batch", "500")}
    metrics, weights = {}, {}
    for name, flags in runs.items():
        out = home / "rm" / name
        metrics[name] = _stage("marlhf.stages.reward", home, out, *RM, *flags)
        weights[name] = load_reward_model(out, dtype=torch.float32)[0].state_dict()
    # three steps of Adam carry the rounding into the evaluation's scores (measured 4e-5 relative)
    _close(metrics["budget"], metrics["padded"], rel=1e-4, abs_=1e-5)
    torch.manual_seed(0)  # the value head is the saved one's shape: compare the backbones
    init = RewardModel.from_pretrained(_tiny_base(home), dtype=torch.float32).state_dict()
    backbone = [k for k in weights["padded"] if k.startswith("backbone.")]
    pick = lambda w: {k: w[k] for k in backbone}  # noqa: E731
    assert update_gap(pick(init), pick(weights["padded"]), pick(weights["budget"])) < 1e-3


@pytest.fixture(scope="module")
def ppo_models(home) -> tuple[str, Path]:
    """tiny-base (its answers stop at EOS) and a reward model on its backbone."""
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model

    actor = _tiny_base(home)
    torch.manual_seed(0)
    rm = home / "ppo_rm"
    save_reward_model(RewardModel.from_pretrained(actor), AutoTokenizer.from_pretrained(actor), rm,
                      score_stats={"mean": 0.0, "std": 1.0})  # fmt: skip
    return actor, rm


PPO = (
    "--max_prompt_seq_len", "192", "--max_answer_seq_len", "24",
    "--per_device_generation_batch_size", "8", "--per_device_training_batch_size", "4",
    "--temperature", "1.0", "--top_k", "0", "--max_steps", "3", "--entropy_coef", "0.01",
    "--termination_condition", "fixed", "--ngram", "3",
)  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        (),
        ("--actor_zero_stage", "3", "--critic_zero_stage", "3", "--actor_lora_dim", "4",
         "--critic_lora_dim", "4", "--actor_learning_rate", "1e-3"),
    ],
    ids=["zero0", "zero3_lora"],
)  # fmt: skip
def test_ppo_packed_and_by_token_budget_equals_padded(home, ppo_models, case):
    actor, rm = ppo_models
    models = ("--actor_model_name_or_path", actor, "--critic_model_name_or_path", str(rm))
    name = "zero3" if case else "zero0"
    runs = {"padded": PADDED, "packed": ("--max_tokens_per_micro_batch", "400")}
    metrics = {}
    for run, flags in runs.items():
        out = home / "ppo" / name / run
        metrics[run] = _stage("marlhf.stages.ppo", home, out, *models, *PPO, *case, *flags)
    want = metrics["padded"]
    # the answers stopped at different lengths: the padded batches held padding
    assert all(0 < r["response/eos_rate"] for r in want)
    # rollout/*: the decoder's record against each path's forward (~1e-6)
    _close(metrics["packed"], want, rel=1e-4, abs_=1e-5)
