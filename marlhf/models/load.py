"""Loading tokenizers and causal LMs (hub id, local directory, or the embedded `tiny`), dtype, dropout,
gradient checkpointing (LoRA: :mod:`marlhf.models.lora`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from marlhf.config import ModelConfig
from marlhf.models.sources import model_source_problem, reward_dir_problem
from marlhf.models.zoo import (
    ARITH_BASE,
    HORIZON_BASES,
    TRAIL_BASE_NAME,
    ensure_arith_base,
    ensure_horizon_base,
    ensure_tiny,
    ensure_tiny_base,
    ensure_tiny_rm_base,
    ensure_trail_base,
)

log = logging.getLogger(__name__)

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_model_path(name_or_path: str, *, tokenizer_only: bool = False) -> str:
    """``tiny`` -> the cached embedded random-init model (built on first use); ``tiny-base`` -> the
    shipped pretrained tiny model; ``tiny-base-{16,64,256}`` -> the shipped bases of the long-horizon
    tasks (``marlhf.data.long_tasks``); ``tiny-base-arith`` -> the shipped base of the arithmetic
    tasks (``marlhf.data.reasoning_tasks``); ``tiny-rm-base`` -> the shipped reward-model base;
    ``tiny-base-trail`` -> the shipped base of the multi-turn trail task (``marlhf.data.trail``)
    (:mod:`marlhf.models.zoo`); anything else unchanged, once it is known to be loadable.

    Raises:
        FileNotFoundError (one line naming the model and what to do) for a local path that does not
        exist, a directory that is no model (no ``config.json``; a tokenizer directory is enough
        with ``tokenizer_only``), or a hub id missing from the local cache while
        ``HF_HUB_OFFLINE`` is set (see :func:`marlhf.models.sources.model_source_problem`).
    """
    if name_or_path in HORIZON_BASES:
        return ensure_horizon_base(name_or_path)
    if name_or_path == "tiny-base":
        return ensure_tiny_base()
    if name_or_path == ARITH_BASE:
        return ensure_arith_base()
    if name_or_path == "tiny":
        return ensure_tiny()
    if name_or_path == "tiny-rm-base":
        return ensure_tiny_rm_base()
    if name_or_path == TRAIL_BASE_NAME:
        return ensure_trail_base()
    problem = model_source_problem(name_or_path, probe_network=False, tokenizer_only=tokenizer_only)
    if problem:
        raise FileNotFoundError(problem)
    return name_or_path


def _load_error(what: str, name: str, err: OSError) -> OSError:
    """One error naming the model for a failed ``from_pretrained`` (raised ``from None``: the hub
    client's chain of retries adds pages, not information, and every rank prints it)."""
    text = " ".join(str(err).split())
    local = os.path.exists(name) or name in ("tiny", "tiny-base")
    where = "" if local else f" ({os.path.abspath(name)} does not exist locally)"
    return OSError(f"cannot load the {what} of {name!r}{where}: {type(err).__name__}: {text}")


def load_tokenizer(cfg: ModelConfig, padding_side: str = "right"):
    """Tokenizer with a pad token. Training pads on the right, generation on the left.

    A tokenizer without a pad token gets its EOS as pad (loss masks and attention masks never depend on
    the pad id, so this is safe).
    """
    from transformers import AutoTokenizer

    name = cfg.tokenizer_name_or_path or cfg.model_name_or_path
    path = resolve_model_path(name, tokenizer_only=True)
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    except OSError as e:
        raise _load_error("tokenizer", name, e) from None
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer of {path} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def set_dropout_config(config: Any, p: float) -> None:
    """Set every dropout probability of a HF config (before the model is built from it)."""
    for key in (
        "dropout",
        "attention_dropout",
        "hidden_dropout",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "activation_dropout",
    ):
        if hasattr(config, key):
            setattr(config, key, p)


def set_model_dropout(model: torch.nn.Module, p: float) -> None:
    """Set dropout on an already-built model: its config, every ``nn.Dropout`` and the float
    ``attention_dropout`` attributes attention modules read at call time (editing only the config
    after construction would change nothing)."""
    if hasattr(model, "config"):
        set_dropout_config(model.config, p)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = p


def load_causal_lm(
    cfg: ModelConfig,
    *,
    path: str | None = None,
    dtype: str | None = None,
    ds_zero3_config: dict | None = None,
):
    """``AutoModelForCausalLM`` from ``path`` (default ``cfg.model_name_or_path``).

    With ``ds_zero3_config`` (a ZeRO-3 DeepSpeed dict) the weights are loaded partitioned across ranks
    (transformers' ``HfDeepSpeedConfig`` must be alive during ``from_pretrained``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    name = path or cfg.model_name_or_path
    path = resolve_model_path(name)
    if os.path.isdir(path):
        problem = reward_dir_problem(path, want_reward=False)
        if problem:
            raise ValueError(problem)
    try:
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    except OSError as e:
        raise _load_error("model config", name, e) from None
    if cfg.dropout is not None:
        set_dropout_config(hf_config, cfg.dropout)
    keep = None
    if ds_zero3_config is not None:
        from transformers.integrations import HfDeepSpeedConfig

        keep = HfDeepSpeedConfig(ds_zero3_config)  # noqa: F841 (must outlive from_pretrained)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            config=hf_config,
            dtype=TORCH_DTYPES[dtype or cfg.dtype],
            trust_remote_code=cfg.trust_remote_code,
        )
    except OSError as e:
        raise _load_error("weights", name, e) from None
    del keep
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    # transformers 5 renamed gradient checkpointing to activation checkpointing (old name until v6)
    fn = getattr(model, "activation_checkpointing_enable", None)
    if fn is not None:
        fn(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    if hasattr(model, "config"):
        model.config.use_cache = False
