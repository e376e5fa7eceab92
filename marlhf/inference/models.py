"""The models of an inference run: checked before anything is loaded (each problem one line naming
the flag), loaded (device, precision, tokenizers), and the policy's sampler (the backend of
``--generation_backend``, :mod:`marlhf.models.generation`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from marlhf.config import ModelConfig
from marlhf.data.tokenize import eot_ids as single_eot
from marlhf.inference.config import InferenceConfig
from marlhf.models.checks import same_tokenizer
from marlhf.models.context import context_problem
from marlhf.models.generation import (
    GenerationBackend,
    SamplerSetup,
    get_backend,
    open_sampler,
    resolve_backend,
)
from marlhf.models.load import TORCH_DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
from marlhf.models.reward_model import load_reward_model
from marlhf.models.sources import model_source_problem, reward_dir_problem

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


POLICY_FLAG = "--model_name_or_path"
REWARD_FLAG = "--reward_model_name_or_path"
CONTEXT_FLAGS = "--max_prompt_seq_len + --max_answer_seq_len"


def model_problems(cfg: InferenceConfig, max_total_seq_len: int | None = None) -> list[str]:
    """What is wrong with the models of a run, before any is loaded (one line each, naming the
    flag): a policy that does not exist or is a reward-model directory, a reward model that is no
    reward-model directory, and prompt + response lengths beyond a model's context (with
    ``max_total_seq_len``, ``--env``'s conversations: that length)."""
    problems = []
    if not cfg.ref_scores:
        p = model_source_problem(cfg.model, POLICY_FLAG)
        if p is None and os.path.isdir(cfg.model):
            p = reward_dir_problem(cfg.model, POLICY_FLAG, want_reward=False)
        if p:
            problems.append(p)
    if cfg.reward_model:
        rm = cfg.reward_model
        if not os.path.isdir(rm):  # reward models are read from local directories only
            problems.append(
                f"{REWARD_FLAG} {rm}: the directory {os.path.abspath(rm)} does not exist; pass "
                "the output directory of stage 2 (marlhf.stages.reward)"
            )
        elif p := reward_dir_problem(rm, REWARD_FLAG, want_reward=True):
            problems.append(p)
    if not problems:
        models = {} if cfg.ref_scores else {POLICY_FLAG: cfg.model}
        if cfg.reward_model:
            models[REWARD_FLAG] = cfg.reward_model
        s = cfg.sampling
        lengths = {
            "--max_prompt_seq_len": s.max_prompt_seq_len,
            "--max_answer_seq_len": s.max_answer_seq_len,
        }
        if max_total_seq_len is not None:
            lengths = {"--max_total_seq_len": max_total_seq_len}
        if p := context_problem(models, lengths):
            problems.append(p)
    return problems


def policy_backend(cfg: InferenceConfig) -> str:
    """``--generation_backend`` with ``auto`` resolved for the policy's config."""
    name = cfg.sampling.generation_backend
    if name != "auto":
        get_backend(name).check(cfg.sampling)
        return name
    from transformers import AutoConfig

    return resolve_backend(name, AutoConfig.from_pretrained(resolve_model_path(cfg.model)))


def open_policy_sampler(cfg: InferenceConfig, models: Models, name: str) -> GenerationBackend:
    """The sampler of backend ``name`` on the loaded policy (or its directory, for a backend with
    an engine of its own), with room for a batch of ``--batch-size`` prompts' samples."""
    n = cfg.n_samples_per_prompt
    setup = SamplerSetup(
        model=models.policy,
        model_path=resolve_model_path(cfg.model),
        dtype=dtype_name(cfg, models.device),
        seed=cfg.seed,
        max_rows=cfg.batch_size * n,
        context_flags=CONTEXT_FLAGS,
    )
    return open_sampler(name, cfg.sampling, setup)


@dataclass
class Models:
    """The loaded models; ``policy``/``tokenizer`` are None with ``--ref-scores`` (``policy`` also
    with a backend that has an engine of its own, unless the macro-action view reads it),
    ``reward_model``/``rm_tokenizer`` None without ``--reward-model``; ``sampler``: the policy's
    sampler (:func:`open_policy_sampler`), None until it is opened."""

    policy: Any
    tokenizer: Any
    reward_model: Any
    rm_tokenizer: Any
    device: torch.device
    sampler: GenerationBackend | None = None


def load_models(
    cfg: InferenceConfig, device: torch.device, need_policy: bool, policy_module: bool = True
) -> Models:
    """The policy (left-padding tokenizer, eval mode; the tokenizer alone without
    ``policy_module``) unless not needed, and the reward model."""
    dtype = dtype_name(cfg, device)
    policy = tok = rm = rm_tok = None
    if need_policy:
        mcfg = ModelConfig(model_name_or_path=cfg.model)
        tok = load_tokenizer(mcfg, padding_side="left")
        if policy_module:
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
