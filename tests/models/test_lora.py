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


def _lora_count(model: torch.nn.Module, r: int) -> int:
    """r * (in + out) of every Linear LoRA adapts (name with `layers.`, not the head)."""
    return sum(
        r * (m.in_features + m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and "layers." in n and not n.endswith("lm_head")
    )


def _perturb(model: torch.nn.Module, which: str, seed: int = 0) -> None:
    """Move the parameters whose name contains ``which`` (as training would)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if which in n and p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)


def test_lora_dim_alone_trains_only_the_lora_weights(tmp_path):
    """--lora_dim without --only_optimize_lora freezes the base (as peft and TRL do);
    --lora_train_base trains it too."""
    path, model, _ = _tiny(tmp_path)
    total = sum(p.numel() for p in model.parameters())
    lora = _lora_count(model, 4)
    frozen = apply_lora(model, ModelConfig(model_name_or_path=str(path), lora_dim=4))
    assert parameter_counts(frozen) == (lora, total + lora)
    _, model, _ = _tiny(tmp_path / "again")
    whole = apply_lora(model, ModelConfig(lora_dim=4, lora_train_base=True))
    assert parameter_counts(whole) == (total + lora, total + lora)


def test_a_base_that_trained_too_gets_no_adapter(tmp_path):
    """With --lora_train_base the merged model is saved alone: an adapter over the untouched base
    would not reproduce it, and one an earlier save left is removed."""
    from transformers import AutoModelForCausalLM

    path, model, tok = _tiny(tmp_path)
    peft_model = apply_lora(model, ModelConfig(lora_dim=4, lora_train_base=True))
    _perturb(peft_model, "lora_B")
    _perturb(peft_model, "embed_tokens", seed=1)
    out = tmp_path / "out"
    (out / ADAPTER_DIR).mkdir(parents=True)
    (out / ADAPTER_DIR / "adapter_config.json").write_text("{}")  # an earlier save's
    save_hf_causal_lm(peft_model, tok, out, zero_stage=0, run_config={}, ds_config={})
    assert not (out / ADAPTER_DIR).exists()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(4, merged.config.vocab_size, (2, 12))
    with torch.no_grad():
        want = peft_model.eval()(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)


def _reward_model_with_lora(tmp_path):
    from transformers import AutoModel

    from marlhf.models.reward_model import RewardModel

    path, _, tok = _tiny(tmp_path)
    torch.manual_seed(2)
    rm = RewardModel(AutoModel.from_pretrained(path, dtype=torch.float32))
    rm.backbone = apply_lora(rm.backbone, ModelConfig(lora_dim=4))
    _perturb(rm, "lora_B")
    _perturb(rm, "v_head")
    return path, rm.eval(), tok


def _check_reward_adapter(path, rm, saved) -> None:
    """``PeftModel.from_pretrained(AutoModel(base), <saved>/adapter)`` and the saved value head
    give the values of the trained reward model, and the saved directory loads with them too."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModel

    from marlhf.models.reward_model import load_reward_model

    ids = torch.randint(
        4, rm.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3)
    )
    mask = torch.ones_like(ids)
    backbone = PeftModel.from_pretrained(
        AutoModel.from_pretrained(path, dtype=torch.float32), saved / ADAPTER_DIR
    ).eval()
    head = load_file(str(saved / "value_head.safetensors"))["weight"]
    with torch.no_grad():
        want = rm(ids, mask)
        hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close((hidden @ head.T).squeeze(-1), want, rtol=1e-4, atol=1e-4)
        loaded, _ = load_reward_model(saved)
        torch.testing.assert_close(loaded.eval()(ids, mask), want, rtol=1e-4, atol=1e-4)


def test_a_reward_model_with_lora_saves_its_adapter(tmp_path):
    from marlhf.models.save import save_reward_checkpoint

    path, rm, tok = _reward_model_with_lora(tmp_path)
    save_reward_checkpoint(
        rm, tok, tmp_path / "rm", zero_stage=0, rm_type="end", run_config={}, ds_config={}
    )
    _check_reward_adapter(path, rm, tmp_path / "rm")


def test_the_ppo_critic_with_lora_saves_its_adapter(tmp_path):
    from types import SimpleNamespace

    from marlhf.models.reward_model import load_reward_model
    from marlhf.stages.ppo.config import ActorCriticConfig
    from marlhf.stages.ppo.state import _save_critic

    path, rm, tok = _reward_model_with_lora(tmp_path)
    models = SimpleNamespace(critic=SimpleNamespace(module=rm), critic_ds={"zero": 0})
    _save_critic(models, tok, tmp_path / "critic", ActorCriticConfig(), {"run": 1})
    _check_reward_adapter(path, rm, tmp_path / "critic")
    assert load_reward_model(tmp_path / "critic")[1]["role"] == "critic"


def test_the_reward_models_parameter_line_counts_its_value_head(tmp_path, caplog):
    from transformers import AutoModel

    from marlhf.cli import parse_config
    from marlhf.stages.reward.config import RewardStageConfig
    from marlhf.stages.reward.train import build_reward_model

    path, _, _ = _tiny(tmp_path)
    backbone = AutoModel.from_pretrained(path)
    total, hidden = sum(p.numel() for p in backbone.parameters()), backbone.config.hidden_size
    lora = _lora_count(backbone, 4)
    for flags, trainable in (([], total + hidden), (["--lora_dim", "4"], lora + hidden)):
        cfg = parse_config(RewardStageConfig, ["--model_name_or_path", str(path), *flags])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="marlhf.lora"):
            build_reward_model(cfg)
        (line,) = [r.getMessage() for r in caplog.records if "trainable" in r.getMessage()]
        assert line.startswith("reward model (value head included)"), line
        n_lora = lora if flags else 0
        assert f"trainable {trainable:,} / total {total + n_lora + hidden:,} " in line, line


def test_lora_flags_that_need_lora_or_contradict_each_other(capsys):
    import pytest

    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.sft.config import SFTConfig

    for cls, argv, message in (
        (SFTConfig, ["--lora_train_base"], "--lora_train_base needs --lora_dim > 0"),
        (
            SFTConfig,
            ["--lora_dim", "4", "--lora_train_base", "--only_optimize_lora"],
            "--only_optimize_lora and --lora_train_base contradict each other",
        ),
        (
            PPOStageConfig,
            ["--lora_train_base"],
            "--lora_train_base needs --actor_lora_dim or --critic_lora_dim > 0",
        ),
    ):
        with pytest.raises(SystemExit):
            parse_config(cls, argv)
        assert f"error: {message}" in capsys.readouterr().err
    cfg = parse_config(PPOStageConfig, ["--critic_lora_dim", "4", "--lora_train_base"])
    assert cfg.models.shared.lora_train_base
