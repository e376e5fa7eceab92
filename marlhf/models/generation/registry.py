"""The registry of generation backends (``--generation_backend``): the backends by name, what each
tells the callers about itself, ``auto``'s choice, and how a backend is opened. Plain data and the
standard library, no torch: the configuration reads it, and ``--help`` and a flag's error come
before torch is imported.

A backend is a :class:`~marlhf.models.generation.base.GenerationBackend` subclass registered with
:func:`register_backend` under its ``name``; its class attributes say what the callers must know
(``records_logprobs``, ``seeds_rows``, ``uses_model``, ``needs_weight_sync``, ``auto_rank``, ...:
:mod:`marlhf.models.generation.base`) and its ``summary`` is its sentence of the flag's help.

Where a backend lives:

- **a built-in backend** is declared here (its class with the attributes, ``supports`` for ``auto``,
  and ``implementation = "package.module:Class"``) and implemented in one module of
  :mod:`marlhf.models.generation.backends` by a subclass that registers itself under the same name
  (``open``, ``sample``, ``check``, ...); :func:`get_backend` imports it when the backend is first
  opened, and puts it in its entry's place;
- **a backend of one's own** is one class with both, in a file ``--plugin`` names
  (:mod:`marlhf.plugins`), which may import torch at its top: it is imported only when named.

Every program samples through :func:`marlhf.models.generation.sampling.sample_responses`.

>>> backend_names()
('hf', 'static', 'vllm')
>>> backend_info("static").records_logprobs, backend_info("hf").seeds_rows
(True, False)
>>> backend_info("static").implementation
'marlhf.models.generation.backends.static:StaticBackend'
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from marlhf.models.generation.base import GenerationBackend, SamplerSetup, SamplingConfig
from marlhf.plugins import declared_implementation, implements_declaration

__all__ = [
    "AUTO",
    "BACKENDS",
    "BACKEND_CHOICES",
    "HF",
    "STATIC_MODEL_TYPES",
    "VLLM",
    "Static",
    "auto_order",
    "backend_info",
    "backend_names",
    "backends_help",
    "get_backend",
    "open_sampler",
    "register_backend",
    "resolve_backend",
]

AUTO = "auto"

BACKENDS: dict[str, type[GenerationBackend]] = {}


def register_backend(cls: type[GenerationBackend]) -> type[GenerationBackend]:
    """Register ``cls`` under its ``name`` (usable as a class decorator). A name is registered
    once; only a built-in's implementation (a subclass of its declaration) takes the declaration's
    place.

    Raises:
        TypeError: ``cls`` is no :class:`GenerationBackend` subclass, or has no ``name``.
        ValueError: the name is ``auto`` or is registered already.
    """
    if not (isinstance(cls, type) and issubclass(cls, GenerationBackend)):
        raise TypeError(f"register_backend takes a GenerationBackend subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__}: a generation backend has a name")
    if name == AUTO or (name in BACKENDS and not implements_declaration(BACKENDS, cls, name)):
        raise ValueError(f"generation backend {name!r} is registered twice")
    BACKENDS[name] = cls
    return cls


class _Choices(Mapping):
    """The values of ``--generation_backend``: ``auto`` and the registered names, read when a value
    is checked and when ``--help`` lists them, so the backends ``--plugin`` files register count
    too."""

    def __getitem__(self, name: str) -> Any:
        if name == AUTO:
            return AUTO
        return BACKENDS[name]

    def __iter__(self) -> Iterator[str]:
        return iter((AUTO, *BACKENDS))

    def __len__(self) -> int:
        return 1 + len(BACKENDS)


BACKEND_CHOICES: Mapping[str, Any] = _Choices()


def backend_names() -> tuple[str, ...]:
    """The registered names, in the order of registration (``--generation_backend`` also takes
    ``auto``)."""
    return tuple(BACKENDS)


def backend_info(name: str) -> type[GenerationBackend]:
    """The class registered as ``name``: its attributes (for a built-in backend not yet opened, its
    declaration: nothing is imported).

    Raises:
        ValueError: ``--generation_backend`` naming the registered backends.
    """
    if name not in BACKENDS:
        raise ValueError(
            f"--generation_backend must be one of {(AUTO, *backend_names())}, got {name!r} "
            "(a backend of your own: name its file with --plugin)"
        )
    return BACKENDS[name]


def get_backend(name: str) -> type[GenerationBackend]:
    """The class that samples for ``name``, its declaration's implementation imported
    (:func:`marlhf.plugins.declared_implementation`); an unknown name: :func:`backend_info`'s
    error."""
    backend_info(name)
    return declared_implementation(BACKENDS, name, "--generation_backend", "backend")


def auto_order() -> tuple[str, ...]:
    """The backends ``auto`` considers, in the order it tries them."""
    ranked = [(b.auto_rank, n) for n, b in BACKENDS.items() if b.auto_rank is not None]
    return tuple(n for _, n in sorted(ranked))


def backends_help() -> str:
    """The help of ``--generation_backend``: every backend's summary and how ``auto`` chooses."""
    lines = [f"`{n}`: {b.summary}" for n, b in BACKENDS.items()]
    order = ", ".join(f"`{n}`" for n in auto_order())
    never = [f"`{n}`" for n, b in BACKENDS.items() if b.auto_rank is None]
    auto = (
        f"`auto`: the first of {order} that can sample the model"
        + (f" ({' and '.join(never)} only when named)" if never else "")
        + ". They sample the same distribution with different random draws."
    )
    return " ".join([*lines, auto, "Or one a --plugin file registers."])


def resolve_backend(
    name: str, model_config: Any, zero3: bool = False, gathered: bool = True
) -> str:
    """``name``, with ``auto`` resolved for a model of ``model_config`` (its HF config): the first
    backend of :func:`auto_order` that supports the model and, for ZeRO-3 partitioned weights
    (``zero3``) that the caller does not gather (``gathered``), can sample from partitions. Reads
    the declarations only."""
    if name != AUTO:
        backend_info(name)
        return name
    for candidate in auto_order():
        cls = BACKENDS[candidate]
        if zero3 and not gathered and not cls.samples_partitioned:
            continue
        if cls.supports(model_config):
            return candidate
    raise ValueError(
        f"--generation_backend auto: no backend can sample {type(model_config).__name__}"
    )


def open_sampler(name: str, cfg: SamplingConfig, setup: SamplerSetup) -> GenerationBackend:
    """The sampler of backend ``name`` (not ``auto``: :func:`resolve_backend` first), its
    implementation imported and its settings checked (:meth:`GenerationBackend.check`)."""
    cls = get_backend(name)
    cls.check(cfg)
    return cls.open(cfg, setup)


# --------------------------------------------------------------------------------------------------
# the built-in backends, in the order --help lists them (implemented in
# marlhf.models.generation.backends, where each module's docstring says how it samples)

# model families the static decoder is tested on (full attention, 4-D additive masks)
STATIC_MODEL_TYPES = ("gemma", "llama", "mistral", "qwen2", "qwen3")


@register_backend
class HF(GenerationBackend):
    """transformers' ``model.generate`` on the caller's model."""

    name = "hf"
    summary = (
        "model.generate (each process samples from its own RNG stream, so samples depend on how "
        "the prompts are batched and split over ranks; records nothing)."
    )
    samples_partitioned = True
    auto_rank = 1
    implementation = "marlhf.models.generation.backends.hf:HFBackend"


@register_backend
class Static(GenerationBackend):
    """The static-KV-cache decoder (:mod:`marlhf.models.decode`) on the caller's model."""

    name = "static"
    summary = (
        "marlhf.models.decode: static KV cache, on-device sampling, each row's noise seeded from "
        "its own seed (the same samples on any number of ranks); records the sampled tokens' "
        "log-probs and entropies (PPO skips one actor forward). Full-attention Llama, Gemma, "
        "Mistral and Qwen models."
    )
    records_logprobs = True
    records_entropy = True
    seeds_rows = True
    auto_rank = 0
    continues_conversations = True
    implementation = "marlhf.models.generation.backends.static:StaticBackend"

    @classmethod
    def supports(cls, model_config: Any) -> bool:
        """Full attention in every layer, no sliding window, a family of
        :data:`STATIC_MODEL_TYPES`."""
        text = (
            model_config.get_text_config()
            if hasattr(model_config, "get_text_config")
            else model_config
        )
        layer_types = getattr(text, "layer_types", None) or []
        full = all(t == "full_attention" for t in layer_types)
        windowed = getattr(text, "sliding_window", None) is not None and (
            getattr(text, "use_sliding_window", True) is not False
        )
        return getattr(text, "model_type", None) in STATIC_MODEL_TYPES and full and not windowed


@register_backend
class VLLM(GenerationBackend):
    """A vLLM engine in this process with its own copy of the weights; ``auto`` never picks it."""

    name = "vllm"
    summary = (
        "a vLLM engine in each process, seeded per row like `static`, recording the sampled "
        "tokens' log-probs (no entropies); a trainer loads its weights into it after every update "
        "(needs vLLM installed: docs/vllm.md)."
    )
    records_logprobs = True
    seeds_rows = True
    uses_model = False
    needs_weight_sync = True
    can_sleep = True
    implementation = "marlhf.models.generation.backends.vllm:VLLMBackend"
