"""The sampling flags every program that generates shares (PPO's rollouts and evaluation,
``marlhf infer``): lengths, temperature, top-k, top-p and the generation backend, written once."""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.config import check_own_numbers, flag
from marlhf.models.config import VLLMConfig
from marlhf.models.generation.registry import AUTO, BACKEND_CHOICES, backend_info, backends_help


@dataclass
class SamplingConfig:
    """How responses are sampled: their lengths, temperature, top-k and top-p, and the backend."""

    max_prompt_seq_len: int = flag(
        256, "Prompt tokens (left-padded).", aliases=("--max_prompt_len",)
    )
    max_answer_seq_len: int = flag(
        256, "Maximum new tokens per response.", aliases=("--max_new_tokens",)
    )
    temperature: float = flag(0.8, "Sampling temperature.", range="(0, inf)")
    top_k: int = flag(50, "Top-k sampling (0: off).")
    top_p: float = flag(1.0, "Nucleus sampling.", range="(0, 1]")
    generation_backend: str = flag(
        AUTO,
        f"The decoder (marlhf.models.generation). {backends_help()}",
        choices=BACKEND_CHOICES,  # auto and the registry: --plugin files' backends count
    )
    compile_generation: bool = flag(
        False,
        "With --generation_backend static on CUDA: CUDA-graph the decode step (torch.compile).",
    )
    # the engine of --generation_backend vllm (flags --vllm_*; ignored by the other backends)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self) -> None:
        for name in ("max_prompt_seq_len", "max_answer_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.generation_backend != AUTO:
            backend_info(self.generation_backend)  # ValueError listing the names; imports nothing
        check_own_numbers(self)
        if self.top_k < 0:
            raise ValueError(f"--top_k must be >= 0, got {self.top_k}")
