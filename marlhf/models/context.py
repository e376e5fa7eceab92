"""How many positions a model takes, from its ``config.json``, and the length flags checked
against it.

A sequence longer than the model's context fails after start-up (GPT-2's learned positions:
``IndexError: index out of range in self`` deep in the embedding) or, with rotary positions
(Llama, Gemma), runs silently past the lengths the model was trained on. Preflight and the stages
refuse instead, naming the flags and the model: ``--max_seq_len`` (SFT, reward model) or
``--max_prompt_seq_len`` + ``--max_answer_seq_len`` (PPO; every model of the run reads the whole
sequence) must fit. The limit is the first of ``LIMIT_KEYS`` in the config (or its
``text_config``); a model without any (relative positions) is not checked.
"""

from __future__ import annotations

import json
import os
from typing import Any

from marlhf.models.load import resolve_model_path
from marlhf.models.sources import EMBEDDED_MODELS, cached_hub_snapshot
from marlhf.models.zoo import TINY_SHAPE

LIMIT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
    "max_seq_len",
)


def context_limit(config: dict) -> tuple[int, str] | None:
    """``(limit, key)`` of a model config (a ``config.json`` as a dict), None without one.

    >>> context_limit({"model_type": "gpt2", "n_positions": 96, "n_ctx": 96})
    (96, 'n_positions')
    >>> context_limit({"text_config": {"max_position_embeddings": 4096}})
    (4096, 'max_position_embeddings')
    """
    for cfg in (config, config.get("text_config") or {}):
        if not isinstance(cfg, dict):
            continue
        for key in LIMIT_KEYS:
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key
    return None


def model_config(name: str) -> dict | None:
    """The ``config.json`` of model ``name`` (an embedded name, a local directory or a hub id in
    the local cache) as a dict; None when it cannot be read from here."""
    path: str | None = None
    if name == "tiny":  # built on first use: its shape is known without building it
        return dict(TINY_SHAPE)
    if name in EMBEDDED_MODELS:
        path = resolve_model_path(name)
    elif os.path.isdir(name):
        path = name
    else:
        path = cached_hub_snapshot(name)
    if path is None:
        return None
    try:
        with open(os.path.join(path, "config.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def context_problem(models: dict[str, str], lengths: dict[str, int]) -> str | None:
    """Why the sequence ``lengths`` (flag -> value, summed) does not fit the context of one of
    ``models`` (flag -> model), or None. One line naming the flags, the model and its limit."""
    needed = sum(lengths.values())
    checked: set[str] = set()
    for flag, name in models.items():
        if not name or name in checked:
            continue
        checked.add(name)
        config = model_config(name)
        found = context_limit(config) if config else None
        if found is None or needed <= found[0]:
            continue
        limit, key = found
        flags = " + ".join(f"{f} {v}" for f, v in lengths.items())
        total = f" = {needed} positions" if len(lengths) > 1 else " positions"
        fix = "lower them so that they add up to" if len(lengths) > 1 else "lower it to"
        return (
            f"{flags}{total}, more than {flag} {name} takes ({key} {limit} in its config.json): "
            f"{fix} {limit} or less"
        )
    return None


def check_context(models: dict[str, str], lengths: dict[str, Any]) -> None:
    """Raise ``ValueError`` with :func:`context_problem`'s line when the lengths do not fit."""
    problem = context_problem(models, lengths)
    if problem is not None:
        raise ValueError(problem)
