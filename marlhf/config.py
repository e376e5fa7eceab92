"""Typed configuration parts shared by the stages (model, optimisation, DeepSpeed, logging).

Stage configs (``marlhf.stages.*``) compose these with the data, macro-action and PPO parts: SFT and
the reward model whole, PPO the fields its four models share (with flag prefixes for the actor and
the critic, :mod:`marlhf.cli`). Flag names follow the original MA-RLHF / DeepSpeed-Chat scripts so
their command lines keep working. Validation raises ``ValueError`` naming the flag and never
rewrites a value.

Numbers: every float field must be finite, and a field whose metadata holds a ``range`` (an
interval in the usual notation, ``"[0, 1]"``, ``"(0, inf)"``, ``"[0, 1)"``) must lie in it;
``inf`` only where the interval is closed at infinity (``"[0, inf]"``, a documented "inf: no
limit"). :func:`check_numbers` applies them: the flag generator (:mod:`marlhf.cli`) for every part
of every program, each part's ``__post_init__`` for a config built in Python.

>>> check_numbers(OptimConfig, {"weight_decay": -5.0})
Traceback (most recent call last):
...
ValueError: --weight_decay must be >= 0, got -5.0
>>> check_numbers(OptimConfig, {"learning_rate": float("nan")})
Traceback (most recent call last):
...
ValueError: --learning_rate must be a finite number >= 0, got nan
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("fp32", "fp16", "bf16")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
TRACKERS = ("tensorboard", "wandb", "trackio", "none")
TRACKER_INSTALL = "pip install 'ma-rlhf[trackers]'"


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (found without importing it)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def tracker_problem(report_to: tuple[str, ...]) -> str | None:
    """Why ``--report_to`` cannot log here (a tracker whose package is not installed), or None."""
    missing = [t for t in report_to if t in ("wandb", "trackio") and not installed(t)]
    if not missing:
        return None
    names = " and ".join(missing)
    return (
        f"--report_to {','.join(report_to)}: {names} {'is' if len(missing) == 1 else 'are'} not "
        f"installed in this environment; {TRACKER_INSTALL} (or pip install {' '.join(missing)}), "
        f"or leave {'it' if len(missing) == 1 else 'them'} out of --report_to"
    )


_INTERVAL = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])$")


def interval(spec: str) -> tuple[float, bool, float, bool]:
    """``(low, low closed, high, high closed)`` of a ``range`` such as ``"(0, 1]"``."""
    m = _INTERVAL.match(spec.strip())
    if m is None:
        raise TypeError(f"range {spec!r} is no interval like '[0, 1]' or '(0, inf)'")
    return float(m[2]), m[1] == "[", float(m[3]), m[4] == "]"


def describe_interval(spec: str) -> str:
    """An interval as a condition: ``>= 0``, ``> 0``, ``<= 1``, ``in (0, 1]``."""
    low, low_in, high, high_in = interval(spec)
    if math.isinf(high):
        text = f"{'>=' if low_in else '>'} {low:g}"
        return text + " (inf allowed)" * high_in
    if math.isinf(low):
        return f"{'<=' if high_in else '<'} {high:g}"
    return f"in {spec.strip()}"


def number_problem(flag: str, value: Any, spec: str | None) -> str | None:
    """What is wrong with ``value`` (a number, a tuple of numbers or None) of ``flag``: NaN, an
    infinity that ``spec`` does not allow, a number outside ``spec``; None when nothing is."""
    low, low_in, high, high_in = interval(spec) if spec else (-math.inf, False, math.inf, False)
    condition = describe_interval(spec) if spec else ""
    for v in value if isinstance(value, tuple) else (value,):
        if v is None or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        inside = (v > low or (low_in and v == low)) and (v < high or (high_in and v == high))
        if math.isnan(v) or (math.isinf(v) and not inside):
            kind = "a number" if math.isinf(high) and high_in else "a finite number"
            return f"{flag} must be {kind}{' ' * bool(condition)}{condition}, got {v}"
        if not inside:
            return f"{flag} must be {condition}, got {v}"
    return None


def check_numbers(cls: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """Check the numbers among ``values`` (field name -> value) of config class ``cls``: floats
    finite, fields with a ``range`` inside it (see the module docstring); ``prefix``: that of the
    part's flags (``actor_``).

    Raises:
        ValueError naming the flag, the allowed values and the value given.
    """
    for f in dataclasses.fields(cls):
        if f.name not in values or dataclasses.is_dataclass(values[f.name]):
            continue
        flag = f.metadata.get("flag") or f"--{prefix}{f.name}"
        problem = number_problem(flag, values[f.name], f.metadata.get("range"))
        if problem:
            raise ValueError(problem)


def check_own_numbers(part: Any) -> None:
    """:func:`check_numbers` of a config instance (its ``__post_init__`` calls it)."""
    check_numbers(type(part), vars(part))


def flag(default: Any = dataclasses.MISSING, help: str = "", **more: Any) -> Any:
    """A config field that is a flag: ``field(default=default, metadata={"help": help, **more})``.
    Without a ``default`` the flag is required; ``more`` is the rest of what :mod:`marlhf.cli`
    reads: ``choices``, ``aliases``, ``range`` (:func:`check_numbers`), ``flag`` (its name, when
    not the field's), ``repeat``, ... (docs/CONVENTIONS.md, "Typed configuration").

    >>> @dataclass
    ... class Part:
    ...     n: int = flag(1, "How many.", range="[1, inf)")
    >>> [(f.default, dict(f.metadata)) for f in dataclasses.fields(Part)]
    [(1, {'help': 'How many.', 'range': '[1, inf)'})]
    """
    return field(default=default, metadata={"help": help, **more})


@dataclass
class ModelConfig:
    """Model loading: hub id, local directory, `tiny` (the embedded default) or `tiny-base`."""

    model_name_or_path: str = flag(
        "tiny",
        "Hub id (e.g. google/gemma-2b), local HF directory, `tiny` for the embedded "
        "tiny Gemma-architecture model built from the bundled corpus (random init), or "
        "`tiny-base`: the same model shipped pretrained on generated posts, or `tiny-rm-base`: "
        "the shipped reward-model base (see marlhf.tiny).",
    )
    tokenizer_name_or_path: str | None = flag(None, "Tokenizer to load; default: the model's own.")
    trust_remote_code: bool = flag(False, "Allow model code from the hub (off unless asked).")
    dtype: str = flag("fp32", "Training precision.", choices=DTYPES)
    gradient_checkpointing: bool = flag(False, "Recompute activations in backward to save memory.")
    dropout: float | None = flag(
        None, "Override the model's dropout probabilities (None keeps the model's).", range="[0, 1)"
    )
    lora_dim: int = flag(
        0,
        "LoRA rank (0 disables LoRA). LoRA is applied through peft and trains the "
        "LoRA weights only (the base model is frozen, as in peft and TRL): the saved model "
        "has them merged, and <model>/adapter/ holds the peft adapter of the base.",
    )
    lora_alpha: float = flag(16.0, "LoRA alpha (scaling = alpha / r).", range="(0, inf)")
    lora_dropout: float = flag(0.0, "LoRA dropout.", range="[0, 1)")
    lora_module_name: str = flag(
        "layers.", "LoRA is applied to Linear modules whose name contains this string."
    )
    only_optimize_lora: bool = flag(
        False,
        "Freeze everything but the LoRA weights: what --lora_dim does (kept for the "
        "original scripts' command lines).",
    )
    lora_train_base: bool = flag(
        False,
        "With --lora_dim: train the base model's weights too, beside the LoRA weights "
        "(the original DeepSpeed-Chat scripts without --only_optimize_lora). The saved model "
        "is the merged one alone: no adapter/ is written, as one applied to the untouched "
        "base would not reproduce it.",
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.lora_dim < 0:
            raise ValueError(f"--lora_dim must be >= 0, got {self.lora_dim}")
        if self.only_optimize_lora and self.lora_train_base:
            raise ValueError("--only_optimize_lora and --lora_train_base contradict each other")

    @property
    def trains_base(self) -> bool:
        """Whether the base model's weights train: without LoRA, or with ``--lora_train_base``."""
        return self.lora_dim == 0 or self.lora_train_base

    def check_lora(self) -> None:
        """A stage that trains this one model: ``--only_optimize_lora`` and ``--lora_train_base``
        need LoRA (PPO's models share the flags, and a model without LoRA trains whole)."""
        for flag in ("only_optimize_lora", "lora_train_base"):
            if getattr(self, flag) and self.lora_dim == 0:
                raise ValueError(f"--{flag} needs --lora_dim > 0")


@dataclass
class OptimConfig:
    """Optimisation: AdamW (torch's, through DeepSpeed's config), schedule, batch sizes."""

    per_device_train_batch_size: int = flag(
        8, "Micro-batch size per device (per process) for training."
    )
    per_device_eval_batch_size: int = flag(8, "Batch size per device for evaluation.")
    gradient_accumulation_steps: int = flag(1, "Micro-batches accumulated per optimizer step.")
    learning_rate: float = flag(5e-5, "Peak learning rate.", range="[0, inf)")
    weight_decay: float = flag(
        0.0, "AdamW weight decay (not applied to biases and norms).", range="[0, inf)"
    )
    adam_beta1: float = flag(0.9, "AdamW beta1.", range="[0, 1)")
    adam_beta2: float = flag(0.95, "AdamW beta2.", range="[0, 1)")
    adam_eps: float = flag(1e-8, "AdamW epsilon.", range="[0, inf)")
    max_grad_norm: float = flag(1.0, "Gradient clipping norm (0 disables).", range="[0, inf)")
    num_train_epochs: int = flag(1, "Passes over the training data.")
    max_steps: int = flag(
        0,
        "Train exactly this many optimizer steps, looping over the data as often as "
        "needed (each epoch in a new order, seeded --seed + epoch); it wins over "
        "--num_train_epochs. 0: --num_train_epochs epochs.",
    )
    lr_scheduler_type: str = flag("cosine", "Learning-rate schedule.", choices=SCHEDULERS)
    num_warmup_steps: int = flag(0, "Warm-up steps (takes precedence over --warmup_ratio).")
    warmup_ratio: float = flag(0.0, "Warm-up as a fraction of total steps.", range="[0, 1)")
    seed: int = flag(1234, "Random seed (data split, shuffling, init).")

    def __post_init__(self) -> None:
        check_own_numbers(self)
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "num_train_epochs",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.num_warmup_steps < 0 or self.max_steps < 0:
            raise ValueError("--num_warmup_steps and --max_steps must be >= 0")
        if self.lr_scheduler_type not in SCHEDULERS:
            raise ValueError(f"--lr_scheduler_type must be one of {SCHEDULERS}")


@dataclass
class DeepSpeedConfig:
    """DeepSpeed: ZeRO stage, offload, launcher integration."""

    zero_stage: int = flag(0, "ZeRO stage 0..3.")
    offload: bool = flag(False, "ZeRO-Offload: optimizer states (and ZeRO-3 params) on CPU.")
    deepspeed_config: str | None = flag(
        None, "A DeepSpeed JSON file merged over the generated config (expert use)."
    )
    local_rank: int = flag(-1, "Set by the deepspeed launcher; read from LOCAL_RANK otherwise.")
    dist_timeout_s: int = flag(1800, "Timeout of collective operations, seconds.")

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"--zero_stage must be 0..3, got {self.zero_stage}")


@dataclass
class LoggingConfig:
    """Output, checkpoints, TensorBoard, progress."""

    output_dir: str = flag("./output", "Where the run writes everything.")
    enable_tensorboard: bool = flag(
        True, "Write TensorBoard scalars under <output_dir>/tensorboard."
    )
    tensorboard_path: str | None = flag(
        None, "TensorBoard directory (default <output_dir>/tensorboard)."
    )
    save_steps: int = flag(0, "Checkpoint every N optimizer steps (0: only at the end).")
    keep_checkpoints: int = flag(2, "Resumable training-state checkpoints kept (oldest deleted).")
    eval_interval: int = flag(
        0,
        "Evaluate every N optimizer steps and after the last (0: at each epoch's end; "
        "PPO: never). PPO evaluates the actor's answers to held-out prompts (eval/*).",
    )
    eval_iters: int = flag(
        0,
        "Evaluation batches per rank per evaluation (0: the whole eval split; PPO: "
        "the eval split's PPO prompts, batches of --per_device_generation_batch_size).",
    )
    log_interval: int = flag(
        1,
        "Log scalars every N optimizer steps (and the last), and with "
        "--disable_progress_bar print the step's line as often.",
    )
    resume: str = flag(
        "auto",
        "`auto`: continue from the latest checkpoint in output_dir if any; `never`; "
        "or a checkpoint directory.",
    )
    resume_with_changes: bool = flag(
        False,
        "Resume even when settings that change what is trained (learning rate, seed, "
        "estimator, global batch, ...) differ from the checkpoint's: they are listed and "
        "appended to <output_dir>/run_history.jsonl. Without it such a resume is refused; "
        "logging, paths and progress may always change.",
    )
    disable_progress_bar: bool = flag(False, "No tqdm bar: one log line per step instead.")
    report_to: tuple[str, ...] = flag(
        ("tensorboard",),
        "Where metrics go besides metrics.jsonl, comma-separated: tensorboard, wandb "
        "(pip install wandb; WANDB_MODE=offline works without an account), trackio (pip "
        "install trackio; local, $TRACKIO_DIR), or none.",
        choices=TRACKERS,
    )
    run_name: str | None = flag(
        None,
        "The run's name in the trackers (default: what ran, e.g. `MA-PPO n=5`, and the "
        "output directory's name).",
    )
    tracker_project: str = flag("ma-rlhf", "The wandb / trackio project the run is logged to.")

    def __post_init__(self) -> None:
        bad = [t for t in self.report_to if t not in TRACKERS]
        if bad or not self.report_to or ("none" in self.report_to and len(self.report_to) > 1):
            raise ValueError(
                f"--report_to must be `none` or a comma-separated list of {TRACKERS[:-1]}, "
                f"got {','.join(self.report_to)!r}"
            )
        for name in ("save_steps", "eval_interval", "eval_iters"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0")
        if self.log_interval < 1:
            raise ValueError("--log_interval must be >= 1")
        if self.keep_checkpoints < 1:
            raise ValueError("--keep_checkpoints must be >= 1")

    def check_environment(self) -> None:
        """What the flags ask of this environment: the packages of ``--report_to``'s trackers.
        Checked when the flags are parsed (:func:`marlhf.cli.config_from_namespace`), not when a
        saved configuration is read back (a run logged to wandb compares where wandb is not)."""
        problem = tracker_problem(self.report_to)
        if problem is not None:
            raise ValueError(problem)


@dataclass
class BatchingConfig:
    """How rows go through the models: packed sequences and token-budget micro-batches."""

    packing: bool = flag(
        True,
        "Run the forward and backward passes over packed rows (each row's tokens end to "
        "end, position ids restarting per row, attention that never crosses rows: "
        "marlhf.models.packing) instead of padded rectangles: the cost follows the tokens, not "
        "the longest row. Exact (the padded results up to float rounding), so on by default "
        "for the model types that build their attention from packed position ids (gemma, "
        "gemma2, llama, mistral, qwen2, qwen3, gpt2) with sdpa, eager or flash attention; "
        "other models run padded. --no_packing: always padded.",
    )
    max_tokens_per_micro_batch: int = flag(
        0,
        "Form the training and scoring micro-batches by a token budget instead of a "
        "row count: the rows sorted by length and cut into micro-batches of at most N "
        "positions (tokens when packed, rows x longest row when padded; a longer row goes "
        "alone), their gradients accumulated into one optimizer step; the update is the same "
        "up to float rounding (marlhf.runtime.micro_batches). 0: by row count.",
    )

    def __post_init__(self) -> None:
        if self.max_tokens_per_micro_batch < 0:
            raise ValueError(
                f"--max_tokens_per_micro_batch must be >= 0, got {self.max_tokens_per_micro_batch}"
            )
