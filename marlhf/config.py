"""Typed configuration parts shared by the stages (model, optimisation, DeepSpeed, logging).

Stage configs (``marlhf.stages.*``) compose these with the data, macro-action and PPO parts: SFT and
the reward model whole, PPO the fields its four models share (with flag prefixes for the actor and
the critic, :mod:`marlhf.cli`). Flag names follow the original MA-RLHF / DeepSpeed-Chat scripts so
their command lines keep working. Validation raises ``ValueError`` naming the flag and never
rewrites a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("fp32", "fp16", "bf16")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
TRACKERS = ("tensorboard", "wandb", "trackio", "none")


@dataclass
class ModelConfig:
    """Model loading: hub id, local directory, `tiny` (the embedded default) or `tiny-base`."""

    model_name_or_path: str = field(
        default="tiny",
        metadata={
            "help": "Hub id (e.g. google/gemma-2b), local HF directory, `tiny` for the embedded "
            "tiny Gemma-architecture model built from the bundled corpus (random init), or "
            "`tiny-base`: the same model shipped pretrained on generated posts, or `tiny-rm-base`: "
            "the shipped reward-model base (see marlhf.tiny)."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer to load; default: the model's own."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model code from the hub (off unless asked)."}
    )
    dtype: str = field(
        default="fp32",
        metadata={"help": "Training precision.", "choices": DTYPES},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in backward to save memory."}
    )
    dropout: float | None = field(
        default=None,
        metadata={"help": "Override the model's dropout probabilities (None keeps the model's)."},
    )
    lora_dim: int = field(
        default=0, metadata={"help": "LoRA rank (0 disables LoRA). LoRA is applied through peft."}
    )
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA alpha (scaling = alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_module_name: str = field(
        default="layers.",
        metadata={"help": "LoRA is applied to Linear modules whose name contains this string."},
    )
    only_optimize_lora: bool = field(
        default=False,
        metadata={"help": "Freeze everything but the LoRA weights (of a model with LoRA)."},
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.lora_dim < 0:
            raise ValueError(f"--lora_dim must be >= 0, got {self.lora_dim}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")

    def check_lora(self) -> None:
        """A stage that trains this one model: ``--only_optimize_lora`` needs LoRA (PPO's models
        share the flag, and a model without LoRA trains whole)."""
        if self.only_optimize_lora and self.lora_dim == 0:
            raise ValueError("--only_optimize_lora needs --lora_dim > 0")


@dataclass
class OptimConfig:
    """Optimisation: AdamW (torch's, through DeepSpeed's config), schedule, batch sizes."""

    per_device_train_batch_size: int = field(
        default=8, metadata={"help": "Micro-batch size per device (per process) for training."}
    )
    per_device_eval_batch_size: int = field(
        default=8, metadata={"help": "Batch size per device for evaluation."}
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches accumulated per optimizer step."}
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate."})
    weight_decay: float = field(
        default=0.0, metadata={"help": "AdamW weight decay (not applied to biases and norms)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.95, metadata={"help": "AdamW beta2."})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "Gradient clipping norm (0 disables)."}
    )
    num_train_epochs: int = field(default=1, metadata={"help": "Passes over the training data."})
    max_steps: int = field(
        default=0,
        metadata={
            "help": "Train exactly this many optimizer steps, looping over the data as often as "
            "needed (each epoch in a new order, seeded --seed + epoch); it wins over "
            "--num_train_epochs. 0: --num_train_epochs epochs."
        },
    )
    lr_scheduler_type: str = field(
        default="cosine", metadata={"help": "Learning-rate schedule.", "choices": SCHEDULERS}
    )
    num_warmup_steps: int = field(
        default=0, metadata={"help": "Warm-up steps (takes precedence over --warmup_ratio)."}
    )
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "Warm-up as a fraction of total steps."}
    )
    seed: int = field(default=1234, metadata={"help": "Random seed (data split, shuffling, init)."})

    def __post_init__(self) -> None:
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "num_train_epochs",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate < 0:
            raise ValueError(f"--learning_rate must be >= 0, got {self.learning_rate}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.num_warmup_steps < 0 or self.max_steps < 0:
            raise ValueError("--num_warmup_steps and --max_steps must be >= 0")
        if self.lr_scheduler_type not in SCHEDULERS:
            raise ValueError(f"--lr_scheduler_type must be one of {SCHEDULERS}")


@dataclass
class DeepSpeedConfig:
    """DeepSpeed: ZeRO stage, offload, launcher integration."""

    zero_stage: int = field(default=0, metadata={"help": "ZeRO stage 0..3."})
    offload: bool = field(
        default=False,
        metadata={"help": "ZeRO-Offload: optimizer states (and ZeRO-3 params) on CPU."},
    )
    deepspeed_config: str | None = field(
        default=None,
        metadata={"help": "A DeepSpeed JSON file merged over the generated config (expert use)."},
    )
    local_rank: int = field(
        default=-1,
        metadata={"help": "Set by the deepspeed launcher; read from LOCAL_RANK otherwise."},
    )
    dist_timeout_s: int = field(
        default=1800, metadata={"help": "Timeout of collective operations, seconds."}
    )

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"--zero_stage must be 0..3, got {self.zero_stage}")


@dataclass
class LoggingConfig:
    """Output, checkpoints, TensorBoard, progress."""

    output_dir: str = field(
        default="./output", metadata={"help": "Where the run writes everything."}
    )
    enable_tensorboard: bool = field(
        default=True, metadata={"help": "Write TensorBoard scalars under <output_dir>/tensorboard."}
    )
    tensorboard_path: str | None = field(
        default=None, metadata={"help": "TensorBoard directory (default <output_dir>/tensorboard)."}
    )
    save_steps: int = field(
        default=0, metadata={"help": "Checkpoint every N optimizer steps (0: only at the end)."}
    )
    keep_checkpoints: int = field(
        default=2, metadata={"help": "Resumable training-state checkpoints kept (oldest deleted)."}
    )
    eval_interval: int = field(
        default=0,
        metadata={
            "help": "Evaluate every N optimizer steps and after the last (0: at each epoch's end; "
            "PPO: never). PPO evaluates the actor's answers to held-out prompts (eval/*)."
        },
    )
    eval_iters: int = field(
        default=0,
        metadata={
            "help": "Evaluation batches per rank per evaluation (0: the whole eval split; PPO: "
            "the eval split's PPO prompts, batches of --per_device_generation_batch_size)."
        },
    )
    log_interval: int = field(default=1, metadata={"help": "Log scalars every N optimizer steps."})
    resume: str = field(
        default="auto",
        metadata={
            "help": "`auto`: continue from the latest checkpoint in output_dir if any; `never`; "
            "or a checkpoint directory."
        },
    )
    resume_with_changes: bool = field(
        default=False,
        metadata={
            "help": "Resume even when settings that change what is trained (learning rate, seed, "
            "estimator, global batch, ...) differ from the checkpoint's: they are listed and "
            "appended to <output_dir>/run_history.jsonl. Without it such a resume is refused; "
            "logging, paths and progress may always change."
        },
    )
    disable_progress_bar: bool = field(
        default=False, metadata={"help": "No tqdm bar: one log line per step instead."}
    )
    report_to: tuple[str, ...] = field(
        default=("tensorboard",),
        metadata={
            "help": "Where metrics go besides metrics.jsonl, comma-separated: tensorboard, wandb "
            "(pip install wandb; WANDB_MODE=offline works without an account), trackio (pip "
            "install trackio; local, $TRACKIO_DIR), or none.",
            "choices": TRACKERS,
        },
    )
    run_name: str | None = field(
        default=None,
        metadata={
            "help": "The run's name in the trackers (default: what ran, e.g. `MA-PPO n=5`, and the "
            "output directory's name)."
        },
    )
    tracker_project: str = field(
        default="ma-rlhf", metadata={"help": "The wandb / trackio project the run is logged to."}
    )

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


@dataclass
class BatchingConfig:
    """How rows go through the models: packed sequences and token-budget micro-batches."""

    packing: bool = field(
        default=True,
        metadata={
            "help": "Run the forward and backward passes over packed rows (each row's tokens end to "
            "end, position ids restarting per row, attention that never crosses rows: "
            "marlhf.models.packing) instead of padded rectangles: the cost follows the tokens, not "
            "the longest row. Exact (the padded results up to float rounding), so on by default "
            "for the model types that build their attention from packed position ids (gemma, "
            "gemma2, llama, mistral, qwen2, qwen3, gpt2) with sdpa, eager or flash attention; "
            "other models run padded. --no_packing: always padded."
        },
    )
    max_tokens_per_micro_batch: int = field(
        default=0,
        metadata={
            "help": "Form the training and scoring micro-batches by a token budget instead of a "
            "row count: the rows sorted by length and cut into micro-batches of at most N "
            "positions (tokens when packed, rows x longest row when padded; a longer row goes "
            "alone), their gradients accumulated into one optimizer step; the update is the same "
            "up to float rounding (marlhf.runtime.micro_batches). 0: by row count."
        },
    )

    def __post_init__(self) -> None:
        if self.max_tokens_per_micro_batch < 0:
            raise ValueError(
                f"--max_tokens_per_micro_batch must be >= 0, got {self.max_tokens_per_micro_batch}"
            )
