"""DeepSpeed engines: the one function that builds DeepSpeed's JSON from the typed config, engine
construction (AdamW parameter groups, LR schedule) for trainable and frozen models, and a ZeRO-3
engine's weights gathered for generation (:func:`gathered_for_generation`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
from marlhf.runtime.distributed import track_engine, world_size

_NO_DECAY = ("bias", "norm", "ln_", "layernorm", "embedding_norm")


def ds_config(
    *,
    zero_stage: int,
    dtype: str,
    micro_batch_size: int,
    gradient_accumulation_steps: int = 1,
    offload: bool = False,
    optim: OptimConfig | None = None,
    learning_rate: float | None = None,
    weight_decay: float | None = None,
    max_grad_norm: float = 1.0,
    on_cpu: bool = True,
    inference: bool = False,
    override_path: str | None = None,
) -> dict[str, Any]:
    """DeepSpeed's config dict for one engine.

    The optimizer is torch's AdamW through DeepSpeed's config (``torch_adam``), so nothing is compiled;
    with ``offload`` on a GPU machine DeepSpeed's CPU Adam is used instead (the fast path for offload).
    ``inference`` builds a config for a frozen model (no optimizer; ZeRO-3 partitions its weights).
    ``train_batch_size`` = micro × accumulation × world size.
    """
    ws = world_size()
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * gradient_accumulation_steps * ws,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": zero_stage},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale_window": 100, "initial_scale_power": 16}
    zero = cfg["zero_optimization"]
    if zero_stage == 3:
        zero.update(
            {
                "stage3_param_persistence_threshold": 1e4,
                "stage3_max_live_parameters": 3e7,
                "stage3_prefetch_bucket_size": 3e7,
                "stage3_gather_16bit_weights_on_model_save": False,
            }
        )
    if offload and zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu"}
        if zero_stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    if not inference:
        assert optim is not None or learning_rate is not None
        lr = learning_rate if learning_rate is not None else optim.learning_rate
        wd = weight_decay if weight_decay is not None else (optim.weight_decay if optim else 0.0)
        betas = (optim.adam_beta1, optim.adam_beta2) if optim else (0.9, 0.95)
        eps = optim.adam_eps if optim else 1e-8
        torch_adam = on_cpu or not offload
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": lr, "betas": list(betas), "eps": eps, "weight_decay": wd},
        }
        if torch_adam:
            cfg["optimizer"]["params"]["torch_adam"] = True
            if offload:
                cfg["zero_force_ds_cpu_optimizer"] = False
        if max_grad_norm and max_grad_norm > 0:
            cfg["gradient_clipping"] = max_grad_norm
    if override_path:
        with open(override_path) as f:
            _deep_update(cfg, json.load(f))
    return cfg


def _deep_update(base: dict, extra: dict) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices, none on biases, norms and 1-d parameters."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or any(k in name.lower() for k in _NO_DECAY):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def lr_lambda(kind: str, warmup: int, total: int):
    """Multiplier of the peak LR at optimizer step ``s`` (0-based): linear warm-up, then the schedule."""
    total = max(total, 1)

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if kind in ("constant", "constant_with_warmup"):
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def warmup_steps(optim: OptimConfig, total_steps: int) -> int:
    if optim.num_warmup_steps > 0:
        return optim.num_warmup_steps
    return int(round(optim.warmup_ratio * total_steps))


def build_train_engine(
    model: torch.nn.Module,
    *,
    model_cfg: ModelConfig,
    ds: DeepSpeedConfig,
    optim: OptimConfig,
    total_steps: int,
    micro_batch_size: int,
    learning_rate: float | None = None,
    weight_decay: float | None = None,
    warmup: int | None = None,
    zero_stage: int | None = None,
):
    """A trainable DeepSpeed engine with AdamW and the LR schedule. Returns ``(engine, ds_json)``."""
    import deepspeed

    on_cpu = deepspeed.get_accelerator().device_name() == "cpu"
    wd = optim.weight_decay if weight_decay is None else weight_decay
    cfg = ds_config(
        zero_stage=ds.zero_stage if zero_stage is None else zero_stage,
        dtype=model_cfg.dtype,
        micro_batch_size=micro_batch_size,
        gradient_accumulation_steps=optim.gradient_accumulation_steps,
        offload=ds.offload,
        optim=optim,
        learning_rate=learning_rate,
        weight_decay=wd,
        max_grad_norm=optim.max_grad_norm,
        on_cpu=on_cpu,
        override_path=ds.deepspeed_config,
    )
    n_warm = warmup_steps(optim, total_steps) if warmup is None else warmup
    schedule = lr_lambda(optim.lr_scheduler_type, n_warm, total_steps)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, wd),
        config=cfg,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule),
    )
    skip_identity_allreduce(engine)
    track_engine(engine)
    return engine, cfg


def skip_identity_allreduce(engine) -> bool:
    """In one process with ZeRO-0 and float32 weights, DeepSpeed's gradient all-reduce after each
    backward (flatten, all-reduce over the one rank, divide by 1, copy back) leaves every gradient
    as it was: turn it off (about 7 % of a small model's backward on CPU). ZeRO stages 1–3 and the
    half-precision optimizers reduce into their own buffers there and keep it. Returns whether it
    was turned off."""
    fp32 = not (engine.bfloat16_enabled() or engine.fp16_enabled())
    if world_size() == 1 and engine.zero_optimization_stage() == 0 and fp32:
        engine.enable_backward_allreduce = False
        return True
    return False


def build_eval_engine(
    model: torch.nn.Module, *, dtype: str, zero_stage: int, offload: bool = False
):
    """A frozen model (reference / reward) under DeepSpeed: ZeRO-3 partitions it across ranks, other
    stages keep a full copy per rank. Returns ``(engine, ds_json)``."""
    import deepspeed

    stage = 3 if zero_stage == 3 else 0
    cfg = ds_config(
        zero_stage=stage,
        dtype=dtype,
        micro_batch_size=1,
        offload=offload and stage == 3,
        inference=True,
    )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    engine.eval()
    track_engine(engine)
    return engine, cfg


@contextmanager
def gathered_for_generation(engine) -> Iterator[None]:
    """A ZeRO-3 ``engine``'s whole weights on every rank, and its module's forward passes local,
    for the duration of the context: no collective, so each rank may run as many of them as it
    needs (a rank whose rows finish early simply stops).

    DeepSpeed's ``GatheredParameters`` alone does not do that: the module's ZeRO-3 hooks still run
    on every forward pass, release the gathered weights after each submodule (the next pass
    all-gathers them again, prefetching ahead), and the root module's hook checks the recorded
    module order against the other ranks (a broadcast) while no trace is complete. Here the
    weights are released first (any prefetch in flight awaited), gathered, the hooks taken off for
    the context and put back after it (with the same module ids; DeepSpeed then records a fresh
    trace on the next forward pass, on every rank alike), and the weights partitioned again.
    An engine without ZeRO-3 hooks (no optimizer) gets ``GatheredParameters`` alone."""
    import deepspeed

    params = list(engine.module.parameters())
    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    if offload is None or not hasattr(offload, "forward_hooks"):
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
        return
    offload.empty_partition_cache()  # every weight released, any prefetch awaited
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        module = offload.module
        start = module._forward_pre_hooks[offload.fwd_pre_hook.id]  # the coordinator's reset
        for hook in (*offload.forward_hooks, *offload.backward_hooks, offload.fwd_pre_hook):
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload.fwd_pre_hook = module.register_forward_pre_hook(start, prepend=True)
            offload._register_deepspeed_module(module, count=[module.ds_id])
