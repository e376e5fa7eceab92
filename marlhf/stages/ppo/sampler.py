"""The rollout sampler in the PPO loop: the backend of ``--generation_backend``
(:mod:`marlhf.models.generation`), opened once per run on the actor, and what the loop does with it.

``auto`` resolves for the actor's config (the static decoder for the full-attention families it
supports, unless the actor is ZeRO-3 partitioned without ``--enable_zero3_generation_gather``;
else ``hf``); ``run_config.json`` records the resolved name. The same sampler serves the
rollouts, the held-out evaluation and ``macro_mc``'s continuations.

A backend with an engine of its own (``vllm``: each rank builds one on the actor's directory, its
process, its device, sampling at ``--temperature`` with room for ``--max_prompt_seq_len`` +
``--max_answer_seq_len`` tokens) gets the actor's weights after the run starts or resumes and
after every actor update (:func:`sync_weights`): under ZeRO-3 each parameter is gathered alone
(``GatheredParameters``, every rank in the same order) and copied, so no rank ever holds the whole
model outside the engine; LoRA is merged, W + (alpha / r)·B·A per adapted module, computed from the
three gathered tensors of that module. Merged rather than loaded as a vLLM adapter: with
``--lora_train_base`` the base weights train too, which an adapter cannot carry; a merged model needs no ``enable_lora`` engine, no adapter written per update and no LoRA
kernels in every decode step. The reference and reward models never go to the engine (they only
score). On a GPU the engine sleeps during the update (:func:`sleep`) and wakes with the new weights.

The rows of the seeding backends (static, vllm) are seeded from (``--seed``, step, global row;
stream 2; ``macro_mc`` continuations stream 3; held-out rows their own): a run is reproducible,
and on any number of ranks each row draws what it draws in one process (vLLM: up to the float
rounding of the engine's batched kernels). vLLM records each sampled token's log-prob at
``--temperature`` before top-k/top-p (``Rollout.logprobs``), but no entropy: scoring computes
π_old and its entropy with the actor, and the record is the behaviour policy, compared with π_old
on every step (``rollout/*``) and corrected for by ``--rollout_correction``
(:func:`marlhf.stages.ppo.scoring.old_policy`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from marlhf.models.generation import (
    AUTO,
    GenerationBackend,
    SamplerSetup,
    backend_info,
    backend_names,
    get_backend,
    open_sampler,
    resolve_backend,
)
from marlhf.models.load import resolve_model_path
from marlhf.models.lora import unwrap_peft
from marlhf.runtime.distributed import barrier

if TYPE_CHECKING:
    from marlhf.stages.ppo.config import PPOStageConfig
    from marlhf.stages.ppo.models import Models
    from marlhf.stages.ppo.prompts import RolloutPlan

CONTEXT_FLAGS = "--max_prompt_seq_len + --max_answer_seq_len"
log = logging.getLogger("marlhf.ppo")


def check_flags(cfg: PPOStageConfig) -> None:
    """One-line errors, before anything is loaded, for the flags a named backend cannot honour
    (:meth:`~marlhf.models.generation.GenerationBackend.check`) and for a backend that needs whole
    weights under ZeRO-3 without ``--enable_zero3_generation_gather``."""
    g = cfg.generation
    if g.generation_backend == AUTO:
        return
    backend = get_backend(g.generation_backend)
    backend.check(g)
    if (
        cfg.models.actor.ds.zero_stage == 3
        and not g.enable_zero3_generation_gather
        and not backend.samples_partitioned
    ):
        partitioned = [n for n in backend_names() if backend_info(n).samples_partitioned]
        raise ValueError(
            f"--enable_zero3_generation_gather false: --generation_backend {backend.name} "
            "samples with the whole weights, never with the ZeRO-3 partitioned actor (those "
            f"that do: {', '.join(partitioned)}); leave the flag at its default"
        )


def run_backend(cfg: PPOStageConfig, actor) -> str:
    """``--generation_backend`` with ``auto`` resolved for the ``actor`` engine's model."""
    g = cfg.generation
    return resolve_backend(
        g.generation_backend,
        actor.module.config,
        zero3=cfg.models.actor.ds.zero_stage == 3,
        gathered=g.enable_zero3_generation_gather,
    )


def open_run_sampler(cfg: PPOStageConfig, plan: RolloutPlan, actor, name: str) -> GenerationBackend:
    """This rank's sampler of backend ``name`` on the ``actor`` engine: room for the largest
    generate call of the run (the rollout's, or ``macro_mc``'s continuations), the actor's
    directory and dtype, ``--seed``."""
    g, ppo, mc = cfg.generation, cfg.ppo, cfg.models
    rows = plan.generation_batch
    if ppo.needs_mc:
        rows = max(rows, ppo.mc_generation_batch_size or rows * ppo.mc_rollouts)
    setup = SamplerSetup(
        model=actor.module,
        model_path=resolve_model_path(mc.actor.model.model_name_or_path),
        dtype=mc.effective_dtype,
        seed=ppo.optim.seed,
        max_rows=rows,
        context_flags=CONTEXT_FLAGS,
        trust_remote_code=mc.shared.trust_remote_code,
        zero3=mc.actor.ds.zero_stage == 3,
        gathered=g.enable_zero3_generation_gather,
    )
    return open_sampler(name, g, setup)


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
    """Load the actor's current weights into a sampler with weights of its own (no-op for the
    others)."""
    sampler = models.sampler
    if sampler is None or not sampler.needs_weight_sync:
        return
    actor = models.actor
    sampler.load_weights(actor_weights(actor.module, actor.zero_optimization_stage() == 3))


def sleep(models: Models) -> None:
    """GPU: free the sampler's memory for the update (vLLM's sleep mode); the next
    :func:`sync_weights` wakes it. No-op for the backends that cannot sleep and on CPU."""
    if models.sampler is not None and models.sampler.can_sleep:
        models.sampler.sleep()


def close(models: Models) -> None:
    """Release the sampler at the end of the run: after a barrier, since vLLM's teardown destroys
    the process group (:meth:`marlhf.models.vllm_engine.VLLMEngine.close`)."""
    if models.sampler is not None:
        barrier()
        models.sampler.close()
        models.sampler = None


def abandon(models: Models) -> None:
    """Release the sampler of a run that stops on an error or a signal, without waiting for the
    other ranks: before the process group is torn down, so that the engine's own teardown (vLLM's
    ends the group) does not run at exit against a group already gone. A failure here is logged,
    not raised: the error being reported matters."""
    sampler, models.sampler = models.sampler, None
    if sampler is None:
        return
    try:
        sampler.close()
    except Exception as e:  # noqa: BLE001 - leaving anyway
        log.warning("closing the %s sampler failed: %s", sampler.name, e)


__all__ = [
    "CONTEXT_FLAGS",
    "abandon",
    "actor_weights",
    "check_flags",
    "close",
    "open_run_sampler",
    "run_backend",
    "sleep",
    "sync_weights",
]
