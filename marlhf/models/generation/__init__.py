"""Sampling responses from a policy, by one of several backends behind one interface.

- :mod:`~marlhf.models.generation.base`: what a backend is (:class:`GenerationBackend`: sample,
  seed handling, whether it records log-probs, weight sync, sleep) and what it is opened on;
- :mod:`~marlhf.models.generation.registry`: the backends by name, ``auto``, and
  :func:`sample_responses`, the call PPO's rollouts, its evaluation and ``marlhf infer`` sample
  through;
- :mod:`~marlhf.models.generation.config`: :class:`SamplingConfig`, the sampling flags those
  programs share;
- :mod:`~marlhf.models.generation.backends`: one module per backend (``hf``, ``static``,
  ``vllm``).
"""

from marlhf.models.generation.base import GenerationBackend, Sampled, SamplerSetup
from marlhf.models.generation.config import SamplingConfig
from marlhf.models.generation.registry import (
    AUTO,
    backend_names,
    get_backend,
    open_sampler,
    resolve_backend,
    sample_responses,
)

__all__ = [
    "AUTO",
    "GenerationBackend",
    "Sampled",
    "SamplerSetup",
    "SamplingConfig",
    "backend_names",
    "get_backend",
    "open_sampler",
    "resolve_backend",
    "sample_responses",
]
