"""Sampling responses from a policy, by one of several backends behind one interface.

- :mod:`~marlhf.models.generation.base`: what a backend is (:class:`GenerationBackend`: sample,
  seed handling, whether it records log-probs, weight sync, sleep) and what it is opened on;
- :mod:`~marlhf.models.generation.registry`: the backends by name (the built-in ones declared
  there), ``auto``, :func:`register_backend` for a ``--plugin`` file's backend, and
  :func:`open_sampler`;
- :mod:`~marlhf.models.generation.config`: :class:`SamplingConfig`, the sampling flags the
  programs that generate share;
- :mod:`~marlhf.models.generation.sampling`: ``sample_responses``, the call PPO's rollouts, its
  evaluation and ``marlhf infer`` sample through, and ``sample_turns``, the next turn of
  multi-turn conversations (:class:`Conversations`) (torch: imported from its module);
- :mod:`~marlhf.models.generation.backends`: the built-in backends' implementations, one module
  each (``hf``, ``static``, ``vllm``), imported when a backend is first opened.

This package imports no torch: the configuration and ``--help`` read it.
"""

from marlhf.models.generation.base import (
    Conversations,
    GenerationBackend,
    Sampled,
    SamplerSetup,
)
from marlhf.models.generation.config import SamplingConfig
from marlhf.models.generation.registry import (
    AUTO,
    backend_info,
    backend_names,
    get_backend,
    open_sampler,
    register_backend,
    resolve_backend,
)

__all__ = [
    "AUTO",
    "Conversations",
    "GenerationBackend",
    "Sampled",
    "SamplerSetup",
    "SamplingConfig",
    "backend_info",
    "backend_names",
    "get_backend",
    "open_sampler",
    "register_backend",
    "resolve_backend",
]
