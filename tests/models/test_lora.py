"""LoRA: the parameter counts a run logs and the peft adapter saved next to the merged model."""

from __future__ import annotations

import logging

import torch

from marlhf.config import ModelConfig
from marlhf.models.lora import apply_lora, parameter_counts
from marlhf.models.save import ADAPTER_DIR, save_hf_causal_lm
from marlhf.models.zoo import build_tiny

CORPUS = ["my cat gained weight and I need diet advice", "dog barks at night"] * 10


def _tiny(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny(tmp_path / "base", CORPUS)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return path, model, AutoTokenizer.from_pretrained(path)


def test_counts_and_log_line(tmp_path, caplog):
    path, model, _ = _tiny(tmp_path)
    total = sum(p.numel() for p in model.parameters())
    # independent count: r * (in + out) for each adapted Linear
    lora = sum(
        4 * (m.in_features + m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and "layers." in n and not n.endswith("lm_head")
    )  # fmt: skip
    cfg = ModelConfig(model_name_or_path=str(path), lora_dim=4, only_optimize_lora=True)
    with caplog.at_level(logging.INFO, logger="marlhf.lora"):
        peft_model = apply_lora(model, cfg, "actor")
    assert parameter_counts(peft_model) == (lora, total + lora)
    line = [r.getMessage() for r in caplog.records if "trainable" in r.getMessage()][-1]
    assert line.startswith("actor with LoRA r=4") and f"trainable {lora:,} / total" in line


def test_adapter_saved_next_to_merged_model_gives_the_same_outputs(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, model, tok = _tiny(tmp_path)
    cfg = ModelConfig(model_name_or_path=str(path), lora_dim=4, only_optimize_lora=True)
    peft_model = apply_lora(model, cfg)
    torch.manual_seed(0)
    with torch.no_grad():  # non-zero B, so the adapter changes the outputs
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    out = tmp_path / "out"
    save_hf_causal_lm(peft_model, tok, out, zero_stage=0, run_config={}, ds_config={})
    assert (out / ADAPTER_DIR / "adapter_config.json").exists()
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, out / ADAPTER_DIR).eval()
    ids = torch.randint(
        4, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        want = peft_model.eval()(input_ids=ids).logits
        torch.testing.assert_close(adapted(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
