"""The vLLM rollout engine in the PPO loop (``--generation_backend vllm``,
:mod:`marlhf.models.vllm_engine`).

Once per run, each rank builds an engine on the actor's directory (its process, its device), sampling
at ``--temperature`` with room for ``--max_prompt_seq_len`` + ``--max_answer_seq_len`` tokens. The
actor's weights are loaded into it after the run starts or resumes and after every actor update
(:func:`sync_weights`): under ZeRO-3 each parameter is gathered alone (``GatheredParameters``, every
rank in the same order) and copied, so no rank ever holds the whole model outside the engine; LoRA
is merged, W + (alpha / r)·B·A per adapted module, computed from the three gathered tensors of that
module. Merged rather than loaded as a vLLM adapter: with ``--lora_train_base`` the base weights
train too, which an adapter cannot carry; a merged model needs no
``enable_lora`` engine, no adapter written per update and no LoRA kernels in every decode step.
The reference and reward models never go to the engine (they only score). On a GPU the engine
sleeps during the update (:func:`sleep`) and wakes with the new weights.

The rows are seeded like the static decoder's (``--seed``, step, global row; stream 2; ``macro_mc``
continuations stream 3): a run is reproducible, and on any number of ranks each row draws what it
draws in one process, up to the float rounding of the engine's batched kernels. The engine records
each sampled token's log-prob at ``--temperature`` before top-k/top-p (``Rollout.logprobs``), but
no entropy: scoring computes π_old and its entropy with the actor, and the record is the behaviour
policy, compared with π_old on every step (``rollout/*``) and corrected for by
``--rollout_correction`` (:func:`marlhf.stages.ppo.scoring.old_policy`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from marlhf.models.load import resolve_model_path
from marlhf.models.lora import unwrap_peft
from marlhf.models.vllm_engine import VLLMEngine, VLLMError, require_vllm
from marlhf.runtime.distributed import barrier

if TYPE_CHECKING:
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.ppo.models import Models
    from marlhf.stages.ppo.prompts import RolloutPlan

CONTEXT_FLAGS = "--max_prompt_seq_len + --max_answer_seq_len"


def check_flags(cfg: PPOStageConfig) -> None:
    """One-line errors for the flags the vLLM backend cannot honour, before anything is loaded."""
    g = cfg.generation
    require_vllm()
    if g.compile_generation:
        raise VLLMError(
            "--compile_generation CUDA-graphs the static decoder; vLLM has its own (on by "
            "default, --vllm_enforce_eager turns them off): leave it out with --generation_backend vllm"
        )
    if cfg.models.actor.ds.zero_stage == 3 and not g.enable_zero3_generation_gather:
        raise VLLMError(
            "--enable_zero3_generation_gather false: the vLLM backend never gathers the whole "
            "actor (it loads the engine one gathered parameter at a time, after each update) and "
            "never generates with the partitioned actor; leave the flag at its default"
        )


def build_engine(cfg: PPOStageConfig, plan: RolloutPlan) -> VLLMEngine:
    """This rank's engine: the actor's directory, its dtype, ``--temperature``, ``--seed``, room
    for the largest generate call of the run (the rollout's, or ``macro_mc``'s continuations)."""
    g, ppo, mc = cfg.generation, cfg.ppo, cfg.models
    rows = plan.generation_batch
    if ppo.needs_mc:
        rows = max(rows, ppo.mc_generation_batch_size or rows * ppo.mc_rollouts)
    return VLLMEngine(
        resolve_model_path(mc.actor.model.model_name_or_path),
        temperature=g.temperature,
        max_model_len=g.max_prompt_seq_len + g.max_answer_seq_len,
        max_num_seqs=rows,
        dtype=mc.effective_dtype,
        seed=ppo.optim.seed,
        cfg=g.vllm,
        trust_remote_code=mc.shared.trust_remote_code,
        context_flags=CONTEXT_FLAGS,
    )


def _gathered(params: list[torch.nn.Parameter], zero3: bool):
    if not zero3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def actor_weights(module: torch.nn.Module, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's weights under their checkpoint names, one tensor at a time.

    ``module``: the causal LM, possibly wrapped by peft (LoRA merged: ``W + scaling·B @ A`` in
    float32, cast back; peft's names mapped back to the plain model's). ``zero3``: each parameter
    (a LoRA module's three) is gathered alone, every rank in the same order, and copied before the
    partition is restored (the engine buffers a layer's tensors until the layer is complete). Tied
    weights come once (``named_parameters``); buffers are the engine's own."""
    base, scaling = unwrap_peft(module)
    params = dict(base.named_parameters())
    for name, p in params.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        if ".base_layer." not in name:
            with _gathered([p], zero3):
                yield name, p.detach().clone() if zero3 else p.detach()
            continue
        prefix, leaf = name.split(".base_layer.")
        a = params.get(f"{prefix}.lora_A.default.weight")
        b = params.get(f"{prefix}.lora_B.default.weight")
        if leaf != "weight" or a is None or b is None:  # a bias of an adapted module
            with _gathered([p], zero3):
                yield f"{prefix}.{leaf}", p.detach().clone() if zero3 else p.detach()
            continue
        with _gathered([p, a, b], zero3):
            merged = p.detach().float() + scaling * (b.detach().float() @ a.detach().float())
            yield f"{prefix}.weight", merged.to(p.dtype)


@torch.no_grad()
def sync_weights(models: Models) -> None:
    """Load the actor's current weights into the rollout engine (no-op without one)."""
    engine = models.rollout
    if engine is None:
        return
    actor = models.actor
    engine.load_weights(actor_weights(actor.module, actor.zero_optimization_stage() == 3))


def sleep(models: Models) -> None:
    """GPU: free the rollout engine's memory for the update (:meth:`VLLMEngine.sleep`); the next
    :func:`sync_weights` wakes it. No-op without an engine and on CPU."""
    if models.rollout is not None:
        models.rollout.sleep()


def close(models: Models) -> None:
    """Shut the rollout engine down at the end of the run (no-op without one): after a barrier,
    since vLLM's teardown destroys the process group (:meth:`VLLMEngine.close`)."""
    if models.rollout is not None:
        barrier()
        models.rollout.close()
        models.rollout = None


__all__ = [
    "close",
    "VLLMError",
    "actor_weights",
    "build_engine",
    "check_flags",
    "sleep",
    "sync_weights",
]
