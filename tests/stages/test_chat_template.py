"""--apply_chat_template end to end: SFT, reward model, PPO and inference on a tiny model whose
tokenizer has a chat template, with HH-style data (multi-turn prompts)."""

from __future__ import annotations

import json
import sys

import pytest

from marlhf.runtime.tracking import read_metrics
from tests.support.chat_model import build_chat_model, write_hh
from tests.support.stage_env import run_stage

pytestmark = pytest.mark.slow


def test_sft_rm_ppo_and_inference_with_the_chat_template(tmp_path):
    model = build_chat_model(tmp_path / "chat")
    data = write_hh(tmp_path / "hh", n=40)
    common = [
        "--data_path", str(data), "--data_split", "1,1,1", "--apply_chat_template",
        "--data_output_path", str(tmp_path / "cache"), "--disable_progress_bar",
    ]  # fmt: skip
    sft, rm, ppo = tmp_path / "sft", tmp_path / "rm", tmp_path / "ppo"
    py = [sys.executable, "-m"]
    run_stage([*py, "marlhf.stages.sft", "--model_name_or_path", str(model), "--max_steps", "1",
               "--per_device_train_batch_size", "2", "--output_dir", str(sft), *common])  # fmt: skip
    run_stage([*py, "marlhf.stages.reward", "--model_name_or_path", str(model), "--max_steps", "1",
               "--per_device_train_batch_size", "2", "--output_dir", str(rm), *common])  # fmt: skip
    proc = run_stage([
        *py, "marlhf.stages.ppo", "--actor_model_name_or_path", str(sft),
        "--critic_model_name_or_path", str(rm), "--max_steps", "1", "--max_prompt_seq_len", "96",
        "--max_answer_seq_len", "8", "--per_device_generation_batch_size", "2",
        "--per_device_training_batch_size", "2", "--output_dir", str(ppo),
        *common,
    ])  # fmt: skip
    assert "PPO:" in proc.stderr
    # every stage tokenised its data with the template: the cache entries say so, and PPO's
    # prompts end where the template hands over to the assistant
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    kinds = set()
    for key_file in (tmp_path / "cache").glob("*/marlhf_cache_key.json"):
        key = json.loads(key_file.read_text())
        assert "chat_template" in key and key["data"]["apply_chat_template"] is True
        kinds.add(key["kind"])
        if key["kind"] == "prompt":
            ids = datasets.load_from_disk(str(key_file.parent))[0]["input_ids"]
            assert tok.decode(ids).rstrip().endswith("<|assistant|>")
    assert kinds == {"sft", "pair", "prompt"}
    for out in (sft, rm, ppo):
        assert read_metrics(out / "metrics.jsonl"), out
    # the saved tokenizers keep the template, so inference renders the same prompts
    assert AutoTokenizer.from_pretrained(ppo / "actor").chat_template
    from marlhf.inference import InferenceArgs, InferenceConfig, read_rows, run_inference
    from marlhf.macro.config import MacroConfig
    from marlhf.models.generation import SamplingConfig
    from marlhf.rewards.code import CodeRewardConfig

    out = tmp_path / "res.jsonl"
    args = InferenceArgs(
        InferenceConfig(
            dataset=str(data), split="train", model=str(ppo / "actor"), reward_model=str(rm),
            num_samples=2, batch_size=2, apply_chat_template=True,
            sampling=SamplingConfig(max_prompt_seq_len=256, max_answer_seq_len=4,
                                    generation_backend="hf"),
            output=str(out), disable_progress_bar=True,
        ),
        MacroConfig(),
        CodeRewardConfig(),
    )  # fmt: skip
    run_inference(args)
    rows = read_rows(str(out))
    assert len(rows) == 2 and rows[0]["prompt"].startswith("\n\nHuman:")
