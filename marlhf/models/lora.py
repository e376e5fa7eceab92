"""LoRA through peft: adapters on the Linear modules a flag names, and their weights folded back into
plain weights, so a saved model loads anywhere without peft."""

from __future__ import annotations

import logging
import re

import torch

from marlhf.config import ModelConfig

log = logging.getLogger("marlhf.lora")


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters of ``model``; a ZeRO-3 partitioned parameter counts whole
    (its ``ds_numel``), so the counts do not depend on the partitioning."""
    trainable = total = 0
    for p in model.parameters():
        n = int(getattr(p, "ds_numel", p.numel()))
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def log_parameter_counts(model: torch.nn.Module, what: str) -> tuple[int, int]:
    """Log ``<what>: trainable N / total M parameters (P %)`` and return the counts."""
    trainable, total = parameter_counts(model)
    log.info(
        "%s: trainable %s / total %s parameters (%.2f %%)",
        what,
        f"{trainable:,}",
        f"{total:,}",
        100.0 * trainable / max(total, 1),
    )
    return trainable, total


def lora_target_modules(model: torch.nn.Module, module_name: str) -> list[str]:
    """Names of the Linear modules whose qualified name contains ``module_name`` (the original
    DeepSpeed-Chat flag's meaning), excluding the output head."""
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and module_name in n and not n.endswith("lm_head")
    ]
    if not names:
        raise ValueError(
            f"--lora_module_name {module_name!r} matches no Linear module of the model"
        )
    return names


def apply_lora(model: torch.nn.Module, cfg: ModelConfig, what: str = "model") -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters when ``--lora_dim > 0``; log its trainable and total
    parameters either way (``what`` names it in the line)."""
    wrapped, described = wrap_lora(model, cfg)
    log_parameter_counts(wrapped, f"{what}{described}")
    return wrapped


def wrap_lora(model: torch.nn.Module, cfg: ModelConfig) -> tuple[torch.nn.Module, str]:
    """``model`` with peft LoRA adapters when ``--lora_dim > 0`` (else itself), and how to describe
    that in a parameter line (`` with LoRA r=8 on 14 modules``, or ""). peft freezes the base
    model; ``--lora_train_base`` trains it too."""
    if cfg.lora_dim == 0:
        return model, ""
    from peft import LoraConfig, get_peft_model

    targets = lora_target_modules(model, cfg.lora_module_name)
    pattern = "^(" + "|".join(re.escape(t) for t in targets) + ")$"
    lcfg = LoraConfig(
        r=cfg.lora_dim,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=pattern,
        bias="none",
    )
    peft_model = get_peft_model(model, lcfg)
    if cfg.lora_train_base:
        for n, p in peft_model.named_parameters():
            if "lora_" not in n:
                p.requires_grad_(True)
    base = ", base trained too" if cfg.lora_train_base else ""
    return peft_model, f" with LoRA r={cfg.lora_dim} on {len(targets)} modules{base}"


def base_trained(module: torch.nn.Module) -> bool:
    """Whether any weight of a peft model outside its LoRA weights trains (``--lora_train_base``):
    then an adapter over the untouched base does not reproduce the model."""
    return any(p.requires_grad for n, p in module.named_parameters() if "lora_" not in n)


def merge_lora_state_dict(
    state: dict[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """Fold peft LoRA weights into plain weights: ``W + scaling · B @ A``; strip peft's prefixes.

    ``state`` is a full (gathered) state dict of a peft-wrapped model with one adapter ("default").
    The result has the keys of the unwrapped base model, so it saves as a normal HF checkpoint.
    """
    out: dict[str, torch.Tensor] = {}
    lora_a = {
        k[: -len(".lora_A.default.weight")]: v
        for k, v in state.items()
        if k.endswith(".lora_A.default.weight")
    }
    lora_b = {
        k[: -len(".lora_B.default.weight")]: v
        for k, v in state.items()
        if k.endswith(".lora_B.default.weight")
    }
    for k, v in state.items():
        if ".lora_A." in k or ".lora_B." in k:
            continue
        key = k
        if key.endswith(".base_layer.weight"):
            mod = key[: -len(".base_layer.weight")]
            if mod in lora_a:
                delta = (lora_b[mod].float() @ lora_a[mod].float()) * scaling
                v = (v.float() + delta).to(v.dtype)
            key = mod + ".weight"
        key = key.replace(".base_layer.", ".")
        # peft's wrapper prefix, at the start (a peft causal LM) or inside (a peft backbone of a reward model)
        key = key.replace("base_model.model.", "")
        out[key] = v
    return out


def unwrap_peft(model: torch.nn.Module) -> tuple[torch.nn.Module, float | None]:
    """(base model, LoRA scaling) for a peft model; (model, None) otherwise."""
    get_base = getattr(model, "get_base_model", None)
    if get_base is None or not hasattr(model, "peft_config"):
        return model, None
    lcfg = model.peft_config["default"]
    return get_base(), lcfg.lora_alpha / lcfg.r
