"""Loading the policy and the reward model (device, precision, tokenizers) for inference."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from marlhf.config import ModelConfig
from marlhf.data.tokenize import eot_ids as single_eot
from marlhf.inference.config import InferenceConfig
from marlhf.models.checks import same_tokenizer
from marlhf.models.load import TORCH_DTYPES, load_causal_lm, load_tokenizer
from marlhf.models.reward_model import load_reward_model

log = logging.getLogger("marlhf.inference")  # one logger name for the whole program


def device_for(gpu: int) -> torch.device:
    """``cuda:<gpu>`` when CUDA is available (ValueError for a missing index), else the CPU."""
    if torch.cuda.is_available():
        if gpu >= torch.cuda.device_count():
            raise ValueError(f"--gpu {gpu}: only {torch.cuda.device_count()} CUDA devices")
        return torch.device(f"cuda:{gpu}")
    return torch.device("cpu")


def dtype_name(cfg: InferenceConfig, device: torch.device) -> str:
    """``--dtype``, with ``auto`` resolved: bf16 on a GPU that has it, else fp32."""
    if cfg.dtype != "auto":
        return cfg.dtype
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def eot_ids(tokenizer: Any, cfg: InferenceConfig) -> list[int]:
    """Token ids appended to a re-tokenised response: ``--end_of_conversation_token`` or eos, one
    token of the reward model's tokenizer (checked as in training, `marlhf.data.tokenize.eot_ids`:
    text that encodes to several pieces is refused, not appended); [] if neither exists."""
    if not (cfg.end_of_conversation_token or tokenizer.eos_token):
        return []
    return single_eot(cfg, tokenizer)


def same_vocab(a: Any, b: Any) -> bool:
    """Whether two tokenizers have the same vocabulary (so token ids can be shared)."""
    return same_tokenizer(a, b)


@dataclass
class Models:
    """The loaded models; ``policy``/``tokenizer`` are None with ``--ref-scores``, ``reward_model``/
    ``rm_tokenizer`` None without ``--reward-model``."""

    policy: Any
    tokenizer: Any
    reward_model: Any
    rm_tokenizer: Any
    device: torch.device


def load_models(cfg: InferenceConfig, device: torch.device, need_policy: bool) -> Models:
    """The policy (left-padding tokenizer, eval mode) unless not needed, and the reward model."""
    dtype = dtype_name(cfg, device)
    policy = tok = rm = rm_tok = None
    if need_policy:
        mcfg = ModelConfig(model_name_or_path=cfg.model)
        tok = load_tokenizer(mcfg, padding_side="left")
        policy = load_causal_lm(mcfg, dtype=dtype).to(device).eval()
    if cfg.reward_model:
        rm, info = load_reward_model(cfg.reward_model, dtype=TORCH_DTYPES[dtype], device=device)
        rm.eval()
        if info.get("rm_type") != "end":
            log.warning(
                "%s is a %s reward model; using its end score",
                cfg.reward_model,
                info.get("rm_type"),
            )
        rm_tok = load_tokenizer(
            ModelConfig(model_name_or_path=cfg.reward_model), padding_side="right"
        )
    return Models(policy, tok, rm, rm_tok, device)
