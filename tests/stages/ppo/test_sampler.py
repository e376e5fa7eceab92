"""The rollout sampler of the PPO loop (marlhf.stages.ppo.sampler) where no vLLM is needed: the
flags each backend refuses with one line, and the actor's weights as an engine of its own is fed
them (LoRA merged, checked against `marlhf.models.merge_lora_state_dict`). The vLLM engine itself is
tested in ``tests/with_vllm/`` (vLLM's environment, ``make test-vllm``)."""

from __future__ import annotations

import sys
from importlib.util import find_spec

import pytest
import torch

from marlhf.models.vllm_engine import INSTALL, VLLMConfig, VLLMError, require_vllm
from marlhf.stages.ppo.config import GenerationConfig, PPOStageConfig
from marlhf.stages.ppo.sampler import actor_weights, check_flags
from tests.support.forked import run_python
from tests.support.stage_env import ROOT, stage_env


def test_missing_vllm_is_a_one_line_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n))
    with pytest.raises(VLLMError, match=r"^--generation_backend vllm: vLLM is not installed .*pip"):
        require_vllm()


def test_flags(monkeypatch):
    assert GenerationConfig(generation_backend="vllm").generation_backend == "vllm"
    with pytest.raises(ValueError, match="--vllm_gpu_memory_utilization"):
        VLLMConfig(vllm_gpu_memory_utilization=1.5)
    monkeypatch.setattr("marlhf.models.generation.backends.vllm.require_vllm", lambda: None)
    cfg = PPOStageConfig(generation=GenerationConfig(generation_backend="vllm"))
    check_flags(cfg.generation, cfg.models)  # the defaults are fine
    cfg.generation.compile_generation = True
    with pytest.raises(VLLMError, match="--compile_generation"):
        check_flags(cfg.generation, cfg.models)
    cfg.generation.compile_generation = False
    cfg.models.actor.ds.zero_stage = 3
    cfg.generation.enable_zero3_generation_gather = False
    with pytest.raises(ValueError, match="--enable_zero3_generation_gather false"):
        check_flags(cfg.generation, cfg.models)
    # the static decoder samples with whole weights too; hf samples from the partitions
    cfg.generation.generation_backend = "static"
    with pytest.raises(ValueError, match="--generation_backend static samples with the whole"):
        check_flags(cfg.generation, cfg.models)
    cfg.generation.generation_backend = "hf"
    check_flags(cfg.generation, cfg.models)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_actor_weights_plain_and_lora_merged():
    from marlhf.config import ModelConfig
    from marlhf.models.lora import apply_lora, merge_lora_state_dict, unwrap_peft

    model = _tiny_llama()
    got = dict(actor_weights(model, zero3=False))
    # tied embeddings come once, under the embedding's name; every tensor is the live parameter
    assert set(got) == {n for n, _ in model.named_parameters()}
    assert "lm_head.weight" not in got
    assert all(got[n].data_ptr() == p.data_ptr() for n, p in model.named_parameters())
    lora = apply_lora(model, ModelConfig(lora_dim=4, lora_alpha=8, lora_module_name="layers."))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    merged = dict(actor_weights(lora, zero3=False))
    base, scaling = unwrap_peft(lora)
    want = merge_lora_state_dict(dict(base.named_parameters()), scaling)
    assert set(merged) == set(want) == set(got)
    for n in want:
        torch.testing.assert_close(merged[n], want[n].detach(), rtol=0, atol=1e-6)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        got["model.layers.0.self_attn.q_proj.weight"],
    )


@pytest.mark.slow
@pytest.mark.skipif(find_spec("vllm") is not None, reason="vLLM is installed here")
def test_stage_without_vllm_stops_with_one_line(tmp_path):
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo", "--generation_backend", "vllm",
        "--advantage_estimator", "grpo", "--n_samples_per_prompt", "2", "--reward_source", "gold",
        "--actor_model_name_or_path", "tiny-base", "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    proc = run_python(
        cmd, env=stage_env(tmp_path / "home"), capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --generation_backend vllm: vLLM is not installed in this environment; {INSTALL}"
    ]
    assert "Traceback" not in proc.stderr
