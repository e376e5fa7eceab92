"""The inference tests' assets: a tiny causal LM and a tiny reward model built in-process, a toy
dataset directory, and the arguments of a run over them."""

import dataclasses

import torch

from marlhf.inference import (
    InferenceArgs,
    InferenceConfig,
)
from marlhf.macro.config import MacroConfig
from marlhf.rewards.code import CodeRewardConfig

# the sampling part's fields, by the names these tests give them (the original script's)
SAMPLING = {
    "max_new_tokens": "max_answer_seq_len",
    "max_prompt_len": "max_prompt_seq_len",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "generation_backend": "generation_backend",
}

CORPUS = [
    "POST\nSubreddit: r/cats\nMy cat Tom is ten years old and gained weight.\nTL;DR: ",
    "my cat gained weight and I need diet advice",
    "POST\nSubreddit: r/dogs\nOur dog Rex barks at night when the neighbours come home.\nTL;DR: ",
    "dog barks at night",
    "print(int(input()) + 1)",
] * 10

PAIRS = [
    ("My cat Tom gained weight.", "cat gained weight", "dog barks"),
    ("Our dog Rex barks at night.", "dog barks at night", "my cat is old"),
    ("The neighbours come home late.", "neighbours late", "cat Tom"),
    ("Tom is ten years old.", "Tom is ten", "Rex barks"),
    ("I need diet advice for my cat.", "diet advice for cat", "night barks"),
    ("Rex and Tom are friends.", "Rex and Tom friends", "diet"),
]


def inference_config(**kw) -> InferenceConfig:
    """An :class:`InferenceConfig` from flat keyword arguments, the sampling ones (``SAMPLING``)
    going to its sampling part (which defaults to inference's, hf included)."""
    sampling = {SAMPLING[k]: kw.pop(k) for k in list(kw) if k in SAMPLING}
    defaults = InferenceConfig().sampling
    return InferenceConfig(**kw, sampling=dataclasses.replace(defaults, **sampling))


def inference_args(assets, tmp_path, **kw) -> InferenceArgs:
    base = dict(
        proj_path=str(tmp_path),
        dataset=assets["data"],
        model=assets["policy"],
        reward_model=assets["rm"],
        max_new_tokens=6,
        max_prompt_len=64,
        batch_size=2,
        disable_progress_bar=True,
    )
    base.update(kw)
    macro = base.pop("macro", MacroConfig())
    return InferenceArgs(inference_config(**base), macro, CodeRewardConfig())


def direct_end_score(rm, ids: list[int]) -> float:
    """Independent reference: one unpadded sequence, the RM's value at its last token."""
    x = torch.tensor([ids])
    with torch.no_grad():
        return float(rm(x, torch.ones_like(x))[0, -1])
