"""The models' configuration parts that need no torch (so that ``--help`` and a flag's validation do
not import it): the vLLM engine of ``--generation_backend vllm`` (:mod:`marlhf.models.vllm_engine`)
and the reward model's types (:mod:`marlhf.models.reward_model`)."""

from __future__ import annotations

from dataclasses import dataclass

from marlhf.config import check_own_numbers, flag

RM_TYPES = ("end", "segment")


@dataclass
class VLLMConfig:
    """The vLLM engine of ``--generation_backend vllm`` (colocated: it shares the trainer's device)."""

    vllm_gpu_memory_utilization: float = flag(
        0.3,
        "GPU: the fraction of the device's memory the engine takes (its weights and KV "
        "cache); the rest is the trainer's. vLLM requires it to be free when the engine "
        "starts, after the four models are loaded. Ignored on CPU, where the KV cache is "
        "sized for the largest generation call.",
        range="(0, 1)",
    )
    vllm_sleep: bool = flag(
        True,
        "GPU: free the engine's weights and KV cache during each update (vLLM sleep "
        "mode, level 2) and wake it with the updated weights for the next rollout. Skipped "
        "on CPU.",
    )
    vllm_enforce_eager: bool = flag(
        False, "GPU: run the engine without CUDA graphs (less memory, slower)."
    )
    vllm_block_size: int = flag(
        0,
        "Tokens per block of the engine's KV cache (0: 16 on a GPU, vLLM's default, and 32 on a "
        "CPU, where it must be a multiple of 32). Its prefix cache serves whole blocks only: a "
        "multi-turn conversation re-reads up to a block of what it has read at every turn.",
        range="[0, inf)",
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
