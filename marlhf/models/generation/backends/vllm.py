"""``--generation_backend vllm``: a vLLM engine in this process (:mod:`marlhf.models.vllm_engine`)
with its own copy of the weights.

Each row is a request with its own seed (the same response in any batch, on any number of ranks,
up to the float rounding of the engine's batched kernels); the engine records each sampled token's
log-prob at the sampling temperature, before top-k/top-p, but no entropy. A trainer loads its
updated weights into the engine after every update (:meth:`VLLMBackend.load_weights`); on a GPU
the engine sleeps while the trainer updates. vLLM is optional and imported when the engine is
built; ``auto`` never picks this backend.

A multi-turn conversation is sent whole at every turn
(:func:`~marlhf.models.generation.sampling.sample_turns`); the engine's prefix cache holds what it
has read of it, so a turn computes about its new tokens only (:mod:`marlhf.models.vllm_engine`)."""

from __future__ import annotations

from marlhf.models.generation.base import SamplerSetup, SamplingConfig
from marlhf.models.generation.registry import VLLM, register_backend
from marlhf.models.vllm_engine import VLLMEngine, VLLMError, require_vllm


@register_backend
class VLLMBackend(VLLM):
    """``vllm`` (declared in :mod:`marlhf.models.generation.registry`): a vLLM engine."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    @classmethod
    def check(cls, cfg: SamplingConfig) -> None:
        require_vllm()
        if cfg.compile_generation:
            raise VLLMError(
                "--compile_generation CUDA-graphs the static decoder; vLLM has its own (on by "
                "default, --vllm_enforce_eager turns them off): leave it out with "
                "--generation_backend vllm"
            )

    @classmethod
    def open(cls, cfg: SamplingConfig, setup: SamplerSetup) -> VLLMBackend:
        return cls(
            VLLMEngine(
                setup.model_path,
                temperature=cfg.temperature,
                max_model_len=cfg.max_prompt_seq_len + cfg.max_answer_seq_len,
                max_num_seqs=setup.max_rows,
                dtype=setup.dtype,
                seed=setup.seed,
                cfg=cfg.vllm,
                trust_remote_code=setup.trust_remote_code,
                context_flags=setup.context_flags,
            )
        )

    def sample(self, prompt_ids, prompt_mask, cfg, eos_ids, pad_id, row_seeds=None):
        response, logprobs = self.engine.sample(
            prompt_ids, prompt_mask, max_new_tokens=cfg.max_answer_seq_len, top_k=cfg.top_k,
            top_p=cfg.top_p, eos_ids=eos_ids, pad_id=pad_id, row_seeds=row_seeds,
            temperature=cfg.temperature,
        )  # fmt: skip
        return response, logprobs, None

    def load_weights(self, weights) -> None:
        self.engine.load_weights(weights)

    def sleep(self) -> None:
        self.engine.sleep()

    def close(self) -> None:
        self.engine.close()
