"""Will it fit? The per-GPU memory of a PPO run, from the model configs alone (no weights).

``python -m marlhf.preflight ppo [stage flags] --plan --num_gpus N [--gpu_memory GB]`` prints, for
each of the four models (actor, critic, reference, reward model), its weights, gradients and
optimizer states per GPU under its ZeRO stage, offload, LoRA and dtype, then the rollout's KV cache
and a rough estimate of the training activations, and whether the total fits ``--gpu_memory``.

Bytes per parameter (P parameters, T of them trained, N GPUs), as DeepSpeed holds them:

============  =====================================  ==========================================
              bf16 / fp16 (16-bit weights, fp32      fp32
              master weights and Adam moments)
============  =====================================  ==========================================
weights       2P (ZeRO-3: 2P/N)                      4P (ZeRO-3: 4P/N)
gradients     16-bit 2T + fp32 4T (ZeRO-1: fp32 /N;  4T (ZeRO-2, 3: /N)
              ZeRO-2, 3: both /N)
optimizer     master 4T + Adam 8T (ZeRO ≥ 1: /N)     Adam 8T (ZeRO ≥ 1: /N)
============  =====================================  ==========================================

ZeRO-3 adds a gathered layer (4 bytes × the largest layer's parameters, DeepSpeed's own figure);
``--offload`` moves the fp32 gradients, master weights and Adam moments to CPU memory (ZeRO ≥ 1) and,
at ZeRO-3, the weights too. For a fully trained model at ZeRO-2 and 3 in half precision, DeepSpeed's
estimators (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``,
``stage3.estimate_zero3_model_states_mem_needs``) are printed next to the plan's figure: ZeRO-2 is
the same sum (2P + 18P/N), ZeRO-3's leaves out the 16-bit weights' partition 2P/N. The frozen
reference and reward model hold weights only (ZeRO-3 partitions the reference with the actor's
stage and the reward model with the critic's; ``--offload_reference_model`` keeps the reference on
CPU).

The rollout's KV cache: generation batch × (prompt + answer) positions × layers × 2 × key/value
heads × head dim × the dtype's bytes (what the static decoder allocates); a ZeRO-3 actor gathers its
full 16-bit weights for generation (``--enable_zero3_generation_gather``). Training activations are
a rough figure (Korthikanti et al. 2022, 34 bytes × hidden per token and layer in 16-bit, attention
scores not stored by SDPA kernels; with activation checkpointing one layer's plus each layer's
input), plus the response positions' logits, for the largest training micro-batch
(:func:`train_micro_batch`: ``--per_device_training_batch_size`` rows of prompt + answer positions,
or at most ``--max_tokens_per_micro_batch`` positions, packed or padded): the real peak depends on
kernels and fragmentation.

Shapes: ``P`` from the config on PyTorch's meta device (no memory), so any architecture transformers
builds is counted exactly, tied embeddings once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from marlhf.models.checks import ppo_model_roles
from marlhf.models.load import resolve_model_path

GiB = 2**30
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of one model, counted on the meta device."""

    params: int  # unique parameters
    largest_layer: int  # parameters of the largest module holding parameters directly
    lora_params: int  # parameters LoRA adds at the planned rank (0 without LoRA)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_shape(
    config, *, backbone: bool = False, lora_dim: int = 0, lora_name: str = "layers."
) -> ModelShape:
    """The :class:`ModelShape` of ``config`` (a transformers config or a dict with ``model_type``):
    a causal LM, or with ``backbone`` the base model plus a value head (the critic and reward
    model). LoRA: rank ``lora_dim`` on the Linear modules whose name contains ``lora_name``."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    if isinstance(config, dict):
        config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = (AutoModel if backbone else AutoModelForCausalLM).from_config(config)
    params = {id(p): p.numel() for p in model.parameters()}  # tied weights once
    largest = max(
        (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0
    )
    lora = 0
    if lora_dim:
        for name, m in model.named_modules():
            if (
                isinstance(m, torch.nn.Linear)
                and lora_name in name
                and not name.endswith("lm_head")
            ):
                lora += lora_dim * (m.in_features + m.out_features)
    t = _text(config)
    heads = t.num_attention_heads
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
    total = sum(params.values()) + (t.hidden_size if backbone else 0)  # + the value head
    return ModelShape(
        total, largest, lora, t.hidden_size, t.num_hidden_layers, heads,
        getattr(t, "num_key_value_heads", None) or heads, head_dim, t.vocab_size,
    )  # fmt: skip


@dataclass(frozen=True)
class EngineSetup:
    """How one model runs: its dtype, ZeRO stage, offload, and how many parameters train."""

    dtype: str
    zero_stage: int
    offload: bool = False
    trainable: bool = True  # False: a frozen engine (weights only)
    lora: bool = False
    only_optimize_lora: bool = False


def engine_memory(shape: ModelShape, setup: EngineSetup, num_gpus: int) -> dict[str, float]:
    """Bytes per GPU of one engine: ``weights``, ``gradients``, ``optimizer``, ``gathered`` (a ZeRO-3
    layer) and ``cpu`` (offloaded), per the table of the module docstring."""
    N, s, half = num_gpus, setup.zero_stage, setup.dtype in ("bf16", "fp16")
    P = shape.params + (shape.lora_params if setup.lora else 0)
    w = _BYTES[setup.dtype]
    out = {"weights": w * P / (N if s == 3 else 1), "gradients": 0.0, "optimizer": 0.0}
    out.update(gathered=4.0 * shape.largest_layer if s == 3 else 0.0, cpu=0.0)
    if setup.offload and s == 3 and setup.trainable:
        out["cpu"] += out["weights"]
        out["weights"] = 0.0
    if not setup.trainable:
        return out
    T = shape.lora_params if setup.lora and setup.only_optimize_lora else P
    g16, g32 = (2.0 * T, 4.0 * T) if half else (0.0, 4.0 * T)
    opt = (12.0 if half else 8.0) * T  # (fp32 master +) Adam's two moments
    g16 /= N if s >= 2 else 1
    g32 /= N if (s >= 1 and half) or s >= 2 else 1
    opt /= N if s >= 1 else 1
    if setup.offload and s >= 1:
        out["cpu"] += g32 + opt
        g32 = opt = 0.0
    out["gradients"], out["optimizer"] = g16 + g32, opt
    return out


def deepspeed_estimate(
    shape: ModelShape, setup: EngineSetup, num_gpus: int, num_nodes: int = 1
) -> float | None:
    """DeepSpeed's own GPU estimate of a fully trained half-precision engine at ZeRO-2 or 3 (None
    elsewhere: DeepSpeed has no estimator for ZeRO-0/1 or fp32, or for a partly frozen model)."""
    if not setup.trainable or setup.dtype == "fp32" or setup.zero_stage < 2:
        return None
    if setup.lora and setup.only_optimize_lora:
        return None
    P = shape.params + (shape.lora_params if setup.lora else 0)
    per_node = max(1, num_gpus // num_nodes)
    if setup.zero_stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, gpu = estimate_zero2_model_states_mem_needs(P, per_node, num_nodes, setup.offload)
        return float(gpu)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    _, gpu, _ = estimate_zero3_model_states_mem_needs(
        P, shape.largest_layer, per_node, num_nodes, setup.offload, setup.offload
    )
    return float(gpu)


def kv_cache_bytes(shape: ModelShape, batch: int, positions: int, dtype: str) -> float:
    """The static decoder's KV cache: batch × positions × layers × 2 × kv heads × head dim."""
    return float(
        batch * positions * shape.layers * 2 * shape.kv_heads * shape.head_dim * _BYTES[dtype]
    )


def activation_bytes(
    shape: ModelShape,
    micro: int,
    seq: int,
    answer: int,
    dtype: str,
    checkpointing: bool,
    lm_head: bool,
) -> float:
    """Rough training activations of one micro-batch (see the module docstring): the layers', and
    with ``lm_head`` the response positions' logits (16-bit, plus a float32 copy)."""
    per_layer = 34.0 * shape.hidden * seq * micro * _BYTES[dtype] / 2
    layers = (
        per_layer + 2.0 * shape.hidden * seq * micro * shape.layers
        if checkpointing
        else per_layer * shape.layers
    )
    logits = micro * answer * shape.vocab * (_BYTES[dtype] + 4) if lm_head else 0.0
    return layers + logits


@dataclass
class Plan:
    """The per-GPU memory of a PPO run (bytes) and what it was computed from."""

    num_gpus: int
    gpu_memory_gb: float | None
    engines: dict[str, dict[str, float]] = field(default_factory=dict)
    deepspeed: dict[str, float | None] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    extras: dict[str, float] = field(
        default_factory=dict
    )  # kv cache, gathered weights, activations
    train_tokens: int = 0  # positions of the largest training micro-batch
    packed: bool = False  # its rows packed (--packing)

    @property
    def model_states(self) -> float:
        return sum(v for e in self.engines.values() for k, v in e.items() if k != "cpu")

    @property
    def generation_peak(self) -> float:
        return (
            self.model_states
            + self.extras.get("kv_cache", 0.0)
            + self.extras.get("zero3_gather", 0.0)
            + self.extras.get("vllm_engine", 0.0)
        )

    @property
    def train_peak(self) -> float:
        held = self.extras.get("vllm_engine_awake", 0.0)  # a vLLM engine kept awake
        return self.model_states + self.extras.get("activations", 0.0) + held

    @property
    def total(self) -> float:
        return max(self.generation_peak, self.train_peak)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory_gb is None else self.total <= self.gpu_memory_gb * GiB


def ppo_plan(
    cfg, num_gpus: int, gpu_memory_gb: float | None = None, configs: dict | None = None
) -> Plan:
    """The :class:`Plan` of a parsed PPO stage config on ``num_gpus`` GPUs. ``configs``: the models'
    configs by role (``actor``, ``critic``, ``reference``, ``reward``; transformers configs or dicts
    with ``model_type``); by default read from the model directories' ``config.json`` (a reward
    model's backbone config is its ``config.json`` too)."""
    mc, g, ppo = cfg.models, cfg.generation, cfg.ppo
    configs = dict(configs or {})
    paths = _model_paths(cfg)
    for role, path in paths.items():
        if role not in configs:
            configs[role] = _read_config(path)
    dtype = mc.effective_dtype
    plan = Plan(num_gpus, gpu_memory_gb)
    actor_m, critic_m = mc.actor.model, mc.critic.model
    actor_z, critic_z = mc.actor.ds.zero_stage, mc.critic.ds.zero_stage
    only_lora, offload = not mc.shared.lora_train_base, mc.ds.offload  # LoRA freezes the base
    setups = {
        "actor": (EngineSetup(dtype, actor_z, offload, True, actor_m.lora_dim > 0, only_lora),
                  False, actor_m.lora_dim),
        "reference": (EngineSetup(dtype, 3 if actor_z == 3 else 0,
                                  mc.offload_reference_model and actor_z == 3, False), False, 0),
    }  # fmt: skip
    if "critic" in paths:
        setups["critic"] = (EngineSetup(dtype, critic_z, offload, True, critic_m.lora_dim > 0,
                                        only_lora), True, critic_m.lora_dim)  # fmt: skip
    if "reward" in paths:
        setups["reward"] = (EngineSetup(dtype, 3 if critic_z == 3 else 0, trainable=False),
                            True, 0)  # fmt: skip
    shapes = {}
    for role, (setup, backbone, lora) in setups.items():
        name = actor_m.lora_module_name if role == "actor" else critic_m.lora_module_name
        shape = model_shape(configs[role], backbone=backbone, lora_dim=lora, lora_name=name)
        shapes[role] = shape
        plan.engines[role] = engine_memory(shape, setup, num_gpus)
        plan.deepspeed[role] = deepspeed_estimate(shape, setup, num_gpus)
        plan.params[role] = shape.params
    actor = shapes["actor"]
    positions = g.max_prompt_seq_len + g.max_answer_seq_len
    if g.generation_backend == "vllm":
        _vllm_share(plan, g.vllm, actor, g.per_device_generation_batch_size * positions, dtype)
    else:
        plan.extras["kv_cache"] = kv_cache_bytes(
            actor, g.per_device_generation_batch_size, positions, dtype
        )
    if actor_z == 3 and g.enable_zero3_generation_gather:
        plan.extras["zero3_gather"] = _BYTES[dtype] * actor.params * (1 - 1 / num_gpus)
    tokens, answers = train_micro_batch(
        ppo.per_device_training_batch_size, positions, g.max_answer_seq_len,
        cfg.perf.batching.max_tokens_per_micro_batch,
    )  # fmt: skip
    plan.train_tokens, plan.packed = tokens, cfg.perf.batching.packing
    act = activation_bytes(actor, 1, tokens, answers, dtype,
                           actor_m.gradient_checkpointing, lm_head=True)  # fmt: skip
    if "critic" in shapes:  # the critic's graph is held with the actor's (first minibatch reuse)
        act += activation_bytes(shapes["critic"], 1, tokens, 0, dtype,
                                critic_m.gradient_checkpointing, lm_head=False)  # fmt: skip
    plan.extras["activations"] = act
    return plan


def train_micro_batch(rows: int, positions: int, answer: int, max_tokens: int) -> tuple[int, int]:
    """The positions and the response positions (LM-head logits) of the largest training
    micro-batch: ``rows`` rows of at most ``positions`` tokens (``answer`` of them response
    tokens), or with a token budget ``max_tokens`` (``--max_tokens_per_micro_batch``) at most
    the budget, or one row where a row is longer. Packed or padded, the bound is the same (rows
    of the longest length fill either alike); packing lowers what typical rows take.

    >>> train_micro_batch(8, 1024, 512, 0), train_micro_batch(8, 1024, 512, 4096)
    ((8192, 4096), (4096, 4096))
    >>> train_micro_batch(8, 1024, 512, 100)  # one row: longer than the budget
    (1024, 512)
    """
    if not max_tokens:
        return rows * positions, rows * answer
    # a micro-batch is rows within the budget, or one row longer than it
    return min(rows * positions, max(max_tokens, positions)), min(
        rows * answer, max(max_tokens, answer)
    )


def _vllm_share(plan: Plan, vcfg, actor: ModelShape, tokens: int, dtype: str) -> None:
    """``--generation_backend vllm``: the engine takes ``--vllm_gpu_memory_utilization`` of the
    GPU (its copy of the actor's weights and its KV cache) instead of the static decoder's cache;
    without ``--gpu_memory`` its floor, the weights and one rollout's KV cache. It holds that share
    through the update too unless ``--vllm_sleep`` frees it."""
    if plan.gpu_memory_gb is not None:
        share = vcfg.vllm_gpu_memory_utilization * plan.gpu_memory_gb * GiB
    else:
        share = _BYTES[dtype] * actor.params + kv_cache_bytes(actor, tokens, 1, dtype)
    plan.extras["vllm_engine"] = share
    if not vcfg.vllm_sleep:
        plan.extras["vllm_engine_awake"] = share


def _model_paths(cfg) -> dict[str, str]:
    """role -> model of a PPO stage config, with the stage's defaults (:func:`ppo_model_roles`);
    the critic only when the estimator builds one."""
    roles = ppo_model_roles(cfg.models, cfg.reward_source)
    paths = {
        "actor": roles["--actor_model_name_or_path"],
        "reference": roles["--reference_model_name_or_path"],
    }
    if cfg.ppo.needs_critic:
        paths["critic"] = roles["--critic_model_name_or_path"]
    if "--reward_model_name_or_path" in roles:
        paths["reward"] = roles["--reward_model_name_or_path"]
    return paths


def _read_config(name: str):
    """The transformers config of a model (hub id, directory or embedded name); no weights read."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model_path(name))


def _gb(x: float) -> str:
    return f"{x / GiB:8.2f}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def format_plan(plan: Plan) -> str:
    """The plan as a table (GiB per GPU), one row per model, then the extras and the verdict."""
    lines = [
        f"memory plan per GPU ({plan.num_gpus} GPU(s)), GiB:",
        f"{'model':<10} {'params':>8} {'weights':>8} {'grads':>8} {'optim':>8} {'zero3':>8} "
        f"{'total':>8} {'on CPU':>8}  DeepSpeed's estimate",
    ]
    for role, e in plan.engines.items():
        total = sum(v for k, v in e.items() if k != "cpu")
        ds = plan.deepspeed.get(role)
        lines.append(
            f"{role:<10} {_count(plan.params[role]):>8} {_gb(e['weights'])} {_gb(e['gradients'])} "
            f"{_gb(e['optimizer'])} {_gb(e['gathered'])} {_gb(total)} {_gb(e['cpu'])}  "
            + ("-" if ds is None else f"{ds / GiB:.2f}")
        )
    lines.append(f"{'model states':<46}{_gb(plan.model_states)}")
    for k, label in (("kv_cache", "rollout KV cache"), ("zero3_gather", "ZeRO-3 weights gathered for generation"),
                     ("vllm_engine", "vLLM engine (weights + KV cache)"),
                     ("vllm_engine_awake", "vLLM engine kept during training"),
                     ("activations", "training activations (rough)")):  # fmt: skip
        if k in plan.extras:
            lines.append(f"{label:<46}{_gb(plan.extras[k])}")
    if plan.train_tokens:
        layout = "packed rows" if plan.packed else "padded rows"
        lines.append(
            f"{'training micro-batch, positions (' + layout + ')':<46}{plan.train_tokens:8d}"
        )
    lines.append(f"{'peak while generating':<46}{_gb(plan.generation_peak)}")
    lines.append(f"{'peak while training':<46}{_gb(plan.train_peak)}")
    if plan.gpu_memory_gb is not None:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"{plan.total / GiB:.2f} GiB of {plan.gpu_memory_gb:g} GiB per GPU: {verdict}")
    return "\n".join(lines)


def split_plan_flags(argv: list[str]) -> tuple[list[str], dict | None]:
    """``argv`` without ``--plan``, ``--num_gpus N`` and ``--gpu_memory GB`` (the preflight's own
    flags), and those options (None without ``--plan``)."""
    rest, opts, i = [], {"num_gpus": 1, "gpu_memory_gb": None}, 0
    plan = False
    while i < len(argv):
        a = argv[i]
        key = a.split("=", 1)[0]
        if key in ("--num_gpus", "--gpu_memory"):
            value = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in a else 2
            try:
                if key == "--num_gpus":
                    opts["num_gpus"] = int(value)
                else:
                    opts["gpu_memory_gb"] = float(value)
            except ValueError:
                raise SystemExit(f"error: {key} takes a number, got {value!r}") from None
            continue
        if a == "--plan":
            plan = True
        else:
            rest.append(a)
        i += 1
    if opts["num_gpus"] < 1:
        raise SystemExit(f"error: --num_gpus must be >= 1, got {opts['num_gpus']}")
    return rest, (opts if plan else None)
