"""The generation backends by name: each module of :mod:`marlhf.models.generation.backends`
defines one :class:`~marlhf.models.generation.base.GenerationBackend` subclass as ``BACKEND``, and
is found here by its file, so adding a backend is adding one module (and its test). The names give
``--generation_backend`` its choices and its help; :func:`sample_responses` is the one call every
program samples through.

>>> backend_names()
('hf', 'static', 'vllm')
>>> get_backend("static").records_logprobs, get_backend("hf").seeds_rows
(True, False)
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

import torch

import marlhf.models.generation.backends as backends_package
from marlhf.models.generation.base import GenerationBackend, Sampled, SamplerSetup, SamplingConfig
from marlhf.models.sequences import response_mask

AUTO = "auto"


@cache
def registry() -> dict[str, type[GenerationBackend]]:
    """``{name: backend class}`` of every module of the backends package, sorted by name."""
    found: dict[str, type[GenerationBackend]] = {}
    for info in sorted(pkgutil.iter_modules(backends_package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{backends_package.__name__}.{info.name}")
        cls = getattr(module, "BACKEND", None)
        if not (isinstance(cls, type) and issubclass(cls, GenerationBackend)):
            raise TypeError(f"{module.__name__} defines no BACKEND (a GenerationBackend subclass)")
        if cls.name in found or cls.name == AUTO:
            raise TypeError(f"{module.__name__}: backend name {cls.name!r} is taken")
        found[cls.name] = cls
    return found


def backend_names() -> tuple[str, ...]:
    """The registered names (``--generation_backend`` also takes ``auto``)."""
    return tuple(registry())


def get_backend(name: str) -> type[GenerationBackend]:
    """The backend class called ``name`` (ValueError listing the names)."""
    if name not in registry():
        raise ValueError(
            f"--generation_backend must be one of {(AUTO, *backend_names())}, got {name!r}"
        )
    return registry()[name]


def auto_order() -> tuple[str, ...]:
    """The backends ``auto`` considers, in the order it tries them."""
    ranked = [(b.auto_rank, n) for n, b in registry().items() if b.auto_rank is not None]
    return tuple(n for _, n in sorted(ranked))


def backends_help() -> str:
    """The help of ``--generation_backend``: every backend's summary and how ``auto`` chooses."""
    lines = [f"`{n}`: {b.summary}" for n, b in registry().items()]
    order = ", ".join(f"`{n}`" for n in auto_order())
    never = [f"`{n}`" for n, b in registry().items() if b.auto_rank is None]
    auto = (
        f"`auto`: the first of {order} that can sample the model"
        + (f" ({' and '.join(never)} only when named)" if never else "")
        + ". They sample the same distribution with different random draws."
    )
    return " ".join([*lines, auto])


def resolve_backend(
    name: str, model_config: Any, zero3: bool = False, gathered: bool = True
) -> str:
    """``name``, with ``auto`` resolved for a model of ``model_config`` (its HF config): the first
    backend of :func:`auto_order` that supports the model and, for ZeRO-3 partitioned weights
    (``zero3``) that the caller does not gather (``gathered``), can sample from partitions."""
    if name != AUTO:
        get_backend(name)
        return name
    for candidate in auto_order():
        cls = registry()[candidate]
        if zero3 and not gathered and not cls.samples_partitioned:
            continue
        if cls.supports(model_config):
            return candidate
    raise ValueError(
        f"--generation_backend auto: no backend can sample {type(model_config).__name__}"
    )


def open_sampler(name: str, cfg: SamplingConfig, setup: SamplerSetup) -> GenerationBackend:
    """The sampler of backend ``name`` (not ``auto``: :func:`resolve_backend` first), its
    settings checked (:meth:`GenerationBackend.check`)."""
    cls = get_backend(name)
    cls.check(cfg)
    return cls.open(cfg, setup)


def sample_responses(
    sampler: GenerationBackend,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    cfg: SamplingConfig,
    eos_ids: list[int],
    pad_id: int,
    row_seeds: torch.Tensor | None = None,
) -> Sampled:
    """One response per row of the left-padded prompts ``prompt_ids``, ``prompt_mask`` (B, P)
    by ``sampler``, as ``cfg`` says (``--max_answer_seq_len``, temperature, top-k, top-p), valid
    up to and including each row's first token of ``eos_ids`` (``pad_id`` after it). ``row_seeds``
    (B,) long: each row's seed, for a backend with ``seeds_rows`` (ignored otherwise; None: the
    global RNG). The tensors are on the prompts' device."""
    seeds = row_seeds if sampler.seeds_rows else None
    response, logprobs, entropy = sampler.sample(
        prompt_ids, prompt_mask, cfg, eos_ids, pad_id, seeds
    )
    if response.shape[1] == 0:  # every row produced nothing: keep one (padding) column
        response = torch.full((prompt_ids.shape[0], 1), pad_id, device=prompt_ids.device)
        logprobs = entropy = None
    action_mask, ends = response_mask(response, eos_ids)
    response = response.masked_fill(~action_mask, pad_id)
    if logprobs is not None:
        logprobs = logprobs.masked_fill(~action_mask, 0.0)
    if entropy is not None:
        entropy = entropy.masked_fill(~action_mask, 0.0)
    return Sampled(response, action_mask, ends, logprobs, entropy)
