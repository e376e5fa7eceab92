"""Typed configuration of stage 3 (MA-PPO). Flag names follow the original step-3 script."""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.algo.names import CORRECTIONS, KL_ESTIMATORS, LOSS_AGG_MODES, RATIO_LEVELS
from marlhf.algo.registry import (
    ESTIMATORS,
    check_estimator_flags,
    estimator_class,
    estimators_help,
    group_size_help,
    resolve_estimator,
)
from marlhf.config import (
    BatchingConfig,
    DeepSpeedConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    check_own_numbers,
)
from marlhf.data.config import DataConfig
from marlhf.envs.config import EnvConfig
from marlhf.macro.config import MacroConfig
from marlhf.models.generation import SamplingConfig, backend_info
from marlhf.rewards import registry as reward_sources
from marlhf.rewards.code import CodeRewardConfig
from marlhf.rewards.config import RewardConfig
from marlhf.runtime.grouping import Grouping
from marlhf.stages.ppo.env_checks import check_env_flags

# the flags of the shared parts that differ between the actor and the critic (prefixed actor_ and
# critic_), and those the models share (one flag each, as in SFT and RM)
PER_MODEL_FLAGS = (
    "model_name_or_path", "gradient_checkpointing", "dropout", "lora_dim", "lora_module_name",
)  # fmt: skip


@dataclass
class TrainedModelConfig:
    """How PPO trains one of its two models: composed twice into :class:`ActorCriticConfig`, its
    flags prefixed ``actor_`` and ``critic_``. Each part holds the flags of a shared part that
    differ between the two models; the settings they share come from ``ActorCriticConfig.shared``,
    ``ActorCriticConfig.ds`` and ``PPOConfig.optim``
    (:func:`marlhf.stages.ppo.models.model_config` and its siblings put them together)."""

    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(model_name_or_path="", dropout=0.0),
        metadata={"flags": PER_MODEL_FLAGS},
    )
    ds: DeepSpeedConfig = field(
        default_factory=DeepSpeedConfig, metadata={"flags": ("zero_stage",)}
    )
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(learning_rate=1e-5),
        metadata={"flags": ("learning_rate", "weight_decay")},
    )


# the fields of the shared parts that PPO's four models share (one flag each, as in SFT and RM)
SHARED_MODEL_FLAGS = ("trust_remote_code", "dtype", "only_optimize_lora", "lora_train_base")
SHARED_DEEPSPEED_FLAGS = ("offload", "local_rank", "dist_timeout_s", "deepspeed_config")


@dataclass
class ActorCriticConfig:
    """The four models: actor (from SFT) and critic (from the RM) train; reference and reward are frozen."""

    actor: TrainedModelConfig = field(
        default_factory=lambda: TrainedModelConfig(
            model=ModelConfig(model_name_or_path="tiny", dropout=0.0)
        ),
        metadata={
            "prefix": "actor_",
            "help": {
                "model_name_or_path": "SFT checkpoint (HF directory or hub id) for the actor and "
                "reference.",
                "dropout": "Actor dropout during the PPO update (default 0: off, as in TRL and "
                "OpenRLHF; with dropout the first minibatch's ratio is not 1 and clipping acts on "
                "dropout noise). `none` keeps the model's own. Experience is always computed with "
                "dropout off.",
            },
        },
    )
    critic: TrainedModelConfig = field(
        default_factory=TrainedModelConfig,
        metadata={
            "prefix": "critic_",
            "help": {
                "model_name_or_path": "Reward-model directory (stage 2) that initialises the critic "
                "(not needed by the critic-free estimators, see --advantage_estimator).",
                "dropout": "Critic dropout during the PPO update (default 0: off); `none` keeps the "
                "model's own. Values for experience are always computed with dropout off.",
            },
        },
    )
    critic_value_head: str = field(
        default="auto",
        metadata={
            "help": "Where the critic's value head comes from: `trained` (the head of the reward "
            "model --critic_model_name_or_path names), `fresh` (a new head on the backbone of "
            "that model, a reward model or any causal LM such as the actor's base), or `auto`: "
            "`trained` for a reward-model directory, `fresh` for a causal LM when the run has no "
            "reward model (a --reward_source without rm). The critic defaults to the actor's model.",
            "choices": ("auto", "trained", "fresh"),
        },
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Frozen reward model (default: --critic_model_name_or_path)."},
    )
    reference_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Frozen reference policy (default: --actor_model_name_or_path)."},
    )
    shared: ModelConfig = field(
        default_factory=ModelConfig,
        metadata={
            "flags": SHARED_MODEL_FLAGS,
            "help": {
                "only_optimize_lora": "Train only the LoRA weights of the models with LoRA: what "
                "--actor_lora_dim and --critic_lora_dim do (kept for the original scripts).",
                "lora_train_base": "With --actor_lora_dim / --critic_lora_dim: train that model's "
                "base weights too; its saved model is then the merged one alone (no adapter/).",
            },
        },
    )
    bf16: bool = field(default=False, metadata={"help": "Alias of --dtype bf16 (original flag)."})
    ds: DeepSpeedConfig = field(
        default_factory=DeepSpeedConfig,
        metadata={
            "flags": SHARED_DEEPSPEED_FLAGS,
            "help": {"offload": "ZeRO-Offload for actor and critic."},
        },
    )
    offload_reference_model: bool = field(
        default=False,
        metadata={"help": "Keep the reference model's weights on CPU (ZeRO-3 offload)."},
    )
    allow_settings_mismatch: bool = field(
        default=False,
        metadata={
            "help": "Train although a model was trained with another --apply_chat_template or "
            "--end_of_conversation_token than this run's (as its run_config.json records): "
            "without it such a run is refused, since the model would see other texts than it "
            "learned on."
        },
    )

    @property
    def effective_dtype(self) -> str:
        return "bf16" if self.bf16 else self.shared.dtype

    def __post_init__(self) -> None:
        if self.bf16 and self.shared.dtype not in ("fp32", "bf16"):
            raise ValueError(f"--bf16 contradicts --dtype {self.shared.dtype}")
        if self.critic_value_head not in ("auto", "trained", "fresh"):
            raise ValueError("--critic_value_head must be auto, trained or fresh")
        if self.shared.lora_train_base and not (
            self.actor.model.lora_dim or self.critic.model.lora_dim
        ):
            raise ValueError("--lora_train_base needs --actor_lora_dim or --critic_lora_dim > 0")


def ppo_optim(**overrides) -> OptimConfig:
    """PPO's schedule and optimisation settings: an :class:`~marlhf.config.OptimConfig` whose
    learning-rate schedule defaults to ``linear`` (``overrides``: its other fields)."""
    return OptimConfig(**{"lr_scheduler_type": "linear", **overrides})


# the optimisation flags the actor and critic share; each model's own are in TrainedModelConfig
PPO_OPTIM_FLAGS = (
    "lr_scheduler_type", "num_warmup_steps", "warmup_ratio", "max_grad_norm", "num_train_epochs",
    "max_steps", "gradient_accumulation_steps", "seed",
)  # fmt: skip


@dataclass
class GenerationConfig(SamplingConfig):
    """Rollout generation: the sampling flags (:class:`marlhf.models.generation.SamplingConfig`,
    shared with ``marlhf infer``) and the rollout's batches. Its fields sit beside the shared
    ones, so ``run_config.json`` keeps them under ``generation``."""

    overlong_prompts: str = field(
        default="drop",
        metadata={
            "help": "Prompts longer than --max_prompt_seq_len: `drop` (the original) or `truncate` "
            "(keep the last tokens). Either way they are counted and logged.",
            "choices": ("drop", "truncate"),
        },
    )
    per_device_generation_batch_size: int = field(
        default=4, metadata={"help": "Prompts per generation call per device."}
    )
    generation_batches: int = field(
        default=1,
        metadata={"help": "Generation calls per PPO step (rollout = their concatenation)."},
    )
    enable_zero3_generation_gather: bool = field(
        default=True,
        metadata={"help": "Under ZeRO-3, gather the actor's weights once per rollout."},
    )
    print_answers: bool = field(
        default=False, metadata={"help": "Print sample responses with macro actions."}
    )
    print_answers_interval: int = field(default=10, metadata={"help": "Every N PPO steps."})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_own_numbers(self)
        for name in ("per_device_generation_batch_size", "generation_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")


@dataclass
class PPOConfig:
    """The PPO algorithm, rewards and schedule."""

    optim: OptimConfig = field(
        default_factory=ppo_optim,
        metadata={
            "flags": PPO_OPTIM_FLAGS,
            "help": {
                "num_train_epochs": "Passes over the PPO prompts.",
                "max_steps": "Train exactly N PPO steps, looping over the prompts as often as "
                "needed (each pass in a new order, seeded --seed + pass); it wins over "
                "--num_train_epochs. 0: --num_train_epochs passes.",
                "gradient_accumulation_steps": "Minibatches per optimizer step.",
            },
        },
    )
    ppo_epochs: int = field(default=1, metadata={"help": "Optimisation epochs over each rollout."})
    per_device_training_batch_size: int = field(
        default=4, metadata={"help": "PPO minibatch per device."}
    )
    cliprange: float = field(
        default=0.2, metadata={"help": "Policy ratio clip.", "range": "(0, inf)"}
    )
    cliprange_value: float = field(
        default=0.2, metadata={"help": "Value clip around old values.", "range": "(0, inf)"}
    )
    gamma: float = field(
        default=1.0, metadata={"help": "GAE discount (over macro actions).", "range": "[0, 1]"}
    )
    lam: float = field(
        default=0.95, metadata={"help": "GAE lambda (over macro actions).", "range": "[0, 1]"}
    )
    kl_ctl: float = field(
        default=0.05,
        metadata={"help": "KL penalty coefficient (initial if adaptive).", "range": "[0, inf)"},
    )
    kl_estimator: str = field(
        default="k1", metadata={"help": "Per-token KL estimator.", "choices": ("k1", "k2", "k3")}
    )
    target_kl: float | None = field(
        default=None,
        metadata={"help": "Adaptive KL controller target (None: fixed).", "range": "(0, inf)"},
    )
    kl_horizon: int = field(default=10000, metadata={"help": "Adaptive KL horizon (samples)."})
    reward_clip: float = field(
        default=2.5,
        metadata={"help": "Clip the reward-model score to ±this (0: off).", "range": "[0, inf)"},
    )
    normalize_reward: bool = field(
        default=False,
        metadata={"help": "Normalise scores with the RM's saved mean/std before clipping."},
    )
    no_eos_penalty: float = field(
        default=0.0,
        metadata={"help": "Added to the score of responses cut at --max_answer_seq_len (e.g. -1)."},
    )
    dense_reward: bool = field(
        default=False,
        metadata={
            "help": "Segment-PPO: use a segment RM's per-segment rewards (location-normalised) spread over tokens."
        },
    )
    dense_reward_mode: str = field(
        default="interpolate",
        metadata={"help": "How segment rewards reach tokens.", "choices": ("interpolate", "last")},
    )
    reward_source: str = field(
        default="auto", metadata={"help": reward_sources.reward_source_help()}
    )
    ratio_level: str = field(
        default="token",
        metadata={
            "help": "Policy ratio per token (original code), per macro action (paper Eq. 3: the "
            "product of its tokens' ratios, clipped per macro action) or per sequence (GSPO: the "
            "length-normalised sequence ratio, clipped per response).",
            "choices": RATIO_LEVELS,
        },
    )
    advantage_estimator: str = field(
        default="gae",
        metadata={"help": estimators_help()},  # the registered estimators
    )
    n_samples_per_prompt: int = field(
        default=1,
        metadata={
            "help": "G: responses sampled per prompt. A step's rollout holds (rollout size x "
            "ranks) / G distinct prompts, each sampled G times; a group is never split by the "
            "estimate (it runs on the gathered batch). " + group_size_help(),
            "range": "[1, inf)",
        },
    )
    mc_rollouts: int = field(
        default=4,
        metadata={
            "help": "`macro_mc`: K continuations drawn from the current policy at each chosen "
            "macro-action boundary (with --env, turn start: the environment replayed by re-running "
            "the episode's steps); the mean of their sequence rewards (returns) is V(boundary).",
            "range": "[1, inf)",
        },
    )
    mc_max_boundaries: int = field(
        default=4,
        metadata={
            "help": "`macro_mc`: at most this many interior boundaries per response, placed by "
            "--mc_boundary_selection (the macro actions in between share one advantage; 0: the "
            "response is one credit segment).",
            "range": "[0, inf)",
        },
    )
    mc_boundary_selection: str = field(
        default="spaced",
        metadata={
            "help": "`macro_mc`: where the boundaries go: `spaced`, the first macro-action start "
            "after every --mc_boundary_spacing tokens (unbiased when the policy decides how many "
            "macro actions a response has), or `spread`, evenly over each response's own macro "
            "actions (the selection depends on the response's length, which biases the gradient).",
            "choices": ("spaced", "spread"),
        },
    )
    mc_boundary_spacing: int = field(
        default=0,
        metadata={
            "help": "`macro_mc` with `spaced` boundaries: tokens between them (0: "
            "--max_answer_seq_len / (--mc_max_boundaries + 1), rounded up; with --env, "
            "min(--max_turns x --max_answer_seq_len, --max_total_seq_len) in its place).",
            "range": "[0, inf)",
        },
    )
    mc_generation_batch_size: int = field(
        default=0,
        metadata={
            "help": "`macro_mc`: continuations per generate call (0: --per_device_generation_"
            "batch_size x --mc_rollouts).",
            "range": "[0, inf)",
        },
    )
    loss_agg_mode: str | None = field(
        default=None,
        metadata={
            "help": "How the policy loss reduces its terms (verl's names): token-mean (every "
            "token or macro action weighs the same), seq-mean-token-sum, seq-mean-token-mean "
            "(every response weighs the same) or seq-mean-token-sum-norm (Dr. GRPO: token sums "
            "divided by --max_answer_seq_len). Default: the estimator's own ("
            + ", ".join(f"{n}: {c.loss_agg_mode}" for n, c in ESTIMATORS.items() if c.loss_agg_mode)
            + "), else token-mean. The value loss stays token-mean.",
            "choices": LOSS_AGG_MODES,
        },
    )
    kl_loss_coef: float = field(
        default=0.0,
        metadata={
            "help": "KL to the reference as a loss term of the actor (GRPO paper; verl's "
            "use_kl_loss), coefficient of agg(KL_t) reduced like the policy loss; usually with "
            "--kl_ctl 0 (no KL in the reward). 0: off.",
            "range": "[0, inf)",
        },
    )
    kl_loss_type: str = field(
        default="k3",
        metadata={
            "help": "Per-token KL estimator of --kl_loss_coef (k3: verl's low_var_kl).",
            "choices": KL_ESTIMATORS,
        },
    )
    rollout_correction: str = field(
        default="auto",
        metadata={
            "help": "Correct for the gap between the rollout engine's log-probs (the static "
            "decoder's or vLLM's record) and the trainer's: `none` (pi_old is the rollout's "
            "record; with vllm the trainer's score, uncorrected), or the "
            "trainer scores pi_old itself every step and weights each policy-loss term by "
            "pi_trainer(old) / pi_rollout at the ratio level in use, truncated at --rollout_is_cap "
            "(`tis`), masked outside [1/cap, cap] (`mis`), or truncated with whole responses "
            "masked whose geometric-mean ratio is outside the band (`seq_mask_tis`). `auto` "
            "(default): `none` in fp32, `tis` in bf16/fp16 (docs/gpu.md, rollout-trainer mismatch). "
            "No effect with --generation_backend hf (no record: pi_old is always scored).",
            "choices": ("auto", *CORRECTIONS),
        },
    )
    rollout_is_cap: float = field(
        default=2.0,
        metadata={
            "help": "C of --rollout_correction: weights truncated at C, or masked outside "
            "[1/C, C] (> 1).",
            "range": "(1, inf)",
        },
    )
    whiten_advantages: bool = field(
        default=False, metadata={"help": "Whiten advantages over valid tokens."}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus coefficient."})
    critic_warmup_steps: int = field(
        default=0, metadata={"help": "First N PPO steps train only the critic."}
    )
    enable_ema: bool = field(
        default=False, metadata={"help": "Keep an EMA of the actor weights (saved as actor_ema)."}
    )
    ema_decay: float = field(default=0.992, metadata={"help": "EMA decay.", "range": "(0, 1)"})
    unsup_coef: float = field(
        default=0.0,
        metadata={
            "help": "Weight of the pretraining/SFT LM loss mixed into the actor update.",
            "range": "[0, inf)",
        },
    )
    unsup_data_path: tuple[str, ...] = field(
        default=(), metadata={"help": "SFT data for --unsup_coef (default: --data_path)."}
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        for name in ("ppo_epochs", "per_device_training_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")
        if self.rollout_correction not in ("auto", *CORRECTIONS):
            raise ValueError(
                f"--rollout_correction must be auto or one of {CORRECTIONS}, "
                f"got {self.rollout_correction!r}"
            )
        reward_sources.check_reward_source(self.reward_source)
        self._check_estimator()

    def _check_estimator(self) -> None:
        """The estimator's flags: its name, G, the Monte-Carlo settings, the loss aggregation
        (what the estimator itself asks: :func:`marlhf.algo.registry.check_estimator_flags`)."""
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(
                f"--ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}"
            )
        if self.mc_boundary_selection not in ("spaced", "spread"):
            raise ValueError(
                "--mc_boundary_selection must be one of ('spaced', 'spread'), got "
                f"{self.mc_boundary_selection!r}"
            )
        if self.loss_agg_mode is not None and self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"--loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}"
            )
        if self.kl_loss_type not in KL_ESTIMATORS:
            raise ValueError(f"--kl_loss_type must be one of {KL_ESTIMATORS}")
        check_estimator_flags(self.advantage_estimator, self)  # ValueError listing the names

    @property
    def estimator(self) -> str:
        """The canonical name of ``--advantage_estimator`` (aliases resolved)."""
        return resolve_estimator(self.advantage_estimator)

    @property
    def needs_critic(self) -> bool:
        """Whether the estimator reads a critic (else none is built, loaded or saved)."""
        return estimator_class(self.advantage_estimator).needs_critic

    @property
    def needs_mc(self) -> bool:
        """Whether the estimator reads Monte-Carlo values (``macro_mc``)."""
        return estimator_class(self.advantage_estimator).needs_mc

    @property
    def policy_loss_agg_mode(self) -> str:
        """``--loss_agg_mode``, else the estimator's own, else token-mean."""
        own = estimator_class(self.advantage_estimator).loss_agg_mode
        return self.loss_agg_mode or own or "token-mean"


# the trainer-side mismatch check costs one actor forward over the rollout (docs/gpu.md: measured);
# every 10th step keeps it under a few per cent of a step
MISMATCH_CHECK_EVERY = 10


@dataclass
class PerfConfig:
    """How a step is computed, not what it computes: the reference paths the fast ones are tested
    against, and resource metrics."""

    recompute_old_logprobs: bool = field(
        default=False,
        metadata={
            "help": "Score log π_old (and its entropy) with a second actor forward pass instead of "
            "taking them from the static decoder, which records them while sampling (same weights, "
            "same dtype: equal up to float rounding). Always recomputed with --generation_backend "
            "hf, and with vllm (its engine records log-probs, no entropies)."
        },
    )
    score_all_positions: bool = field(
        default=False,
        metadata={
            "help": "Reference path: compute the LM head at every position and pass the padding "
            "mask to the attention (the default applies the head at the response positions only "
            "and runs plain causal attention, exact for flush-left right-padded batches)."
        },
    )
    length_groups: int = field(
        default=4,
        metadata={
            "help": "Score and train in up to this many forward passes per batch, the rows sorted "
            "by length and cut where padding costs most (marlhf.runtime.length_groups): each row's "
            "outputs are the one-pass ones up to float rounding, the padding is skipped. "
            "1: one pass over the batch. With --packing each pass is packed. Ignored with "
            "--score_all_positions."
        },
    )
    length_group_call_tokens: float = field(
        default=64.0,
        metadata={
            "help": "With --length_groups: a pass's fixed cost in padded positions; a batch is "
            "split only where the padding saved exceeds it (64: one forward call of the tiny CPU "
            "model costs about what 64 tokens do; raise it for GPUs and large models).",
            "range": "[0, inf)",
        },
    )
    reuse_critic_forward: bool = field(
        default=True,
        metadata={
            "help": "The update's first minibatch takes its critic forward pass from scoring: its "
            "rows' values are computed once, with grad, and that minibatch's critic step (taken "
            "before its actor step) backpropagates through them. Same weights, same rows: one "
            "forward pass less per step, equal up to float rounding. Only on one rank and without "
            "critic dropout; --no_reuse_critic_forward scores every value without grad."
        },
    )
    mismatch_check_every: int = field(
        default=MISMATCH_CHECK_EVERY,
        metadata={
            "help": "When pi_old is the rollout engine's record (--rollout_correction none), the "
            "trainer also scores the sampled tokens itself on the first step and every N steps and "
            "logs rollout/logprob_diff_mean, rollout/logprob_diff_max, rollout/k3_kl and "
            "rollout/ratio_{min,max}_{token,macro,seq} (0: never; with a correction, and with "
            "--generation_backend vllm, whose pi_old the trainer always scores, they are logged "
            "every step). One actor forward pass per check (docs/gpu.md)."
        },
    )
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    log_phase_resources: bool = field(
        default=False,
        metadata={
            "help": "Also log per phase (generate, score, macro, train) the CPU seconds "
            "(time_cpu/*), the peak resident memory (mem/peak_rss_mb/*) and on CUDA the peak "
            "allocated memory (mem/peak_cuda_mb/*). Used by benchmarks/bench_ppo.py."
        },
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        if self.mismatch_check_every < 0:
            raise ValueError(
                f"--mismatch_check_every must be >= 0, got {self.mismatch_check_every}"
            )
        if self.length_groups < 1:
            raise ValueError(f"--length_groups must be >= 1, got {self.length_groups}")

    @property
    def grouping(self):
        """The score and update passes' :class:`marlhf.runtime.length_groups.Grouping`."""
        args = (self.length_groups, self.length_group_call_tokens)
        return Grouping(*args, self.batching.packing, self.batching.max_tokens_per_micro_batch)


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer's forward passes (scoring and the update) and the update's losses read,
    unpacked once from the stage config (:attr:`PPOStageConfig.trainer`)."""

    ppo: PPOConfig
    temperature: float  # --temperature: log-probs at the sampling temperature
    max_answer_seq_len: int  # the seq-mean-token-sum-norm loss divides by it
    perf: PerfConfig  # the paths: all positions or the response's, length groups, packing
    correction: str = "none"  # --rollout_correction resolved (PPOStageConfig.correction)


@dataclass
class PPOStageConfig:
    """Stage 3: MA-PPO (PPO over macro actions)."""

    models: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)
    data: DataConfig = field(default_factory=DataConfig)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    env: EnvConfig = field(default_factory=EnvConfig)

    @property
    def correction(self) -> str:
        """``--rollout_correction`` with ``auto`` resolved for the dtype: ``none`` in fp32 (the
        decoder's record is the trainer's forward to float rounding), ``tis`` in half precision."""
        mode = self.ppo.rollout_correction
        if mode != "auto":
            return mode
        return "none" if self.models.effective_dtype == "fp32" else "tis"

    @property
    def trainer(self) -> TrainerSettings:
        """The :class:`TrainerSettings` of this config."""
        g, ppo = self.generation, self.ppo
        return TrainerSettings(ppo, g.temperature, g.max_answer_seq_len, self.perf, self.correction)

    @property
    def reward_source(self) -> str:
        """``--reward_source`` with ``auto`` resolved (:func:`marlhf.rewards.registry.resolve_reward_source`;
        with ``--env``: ``none``, the environment's rewards alone)."""
        if self.env.env is not None and self.ppo.reward_source == "auto":
            return "none"
        return reward_sources.resolve_reward_source(
            self.ppo.reward_source, self.reward.custom, self.data.data_path
        )

    def __post_init__(self) -> None:
        ppo, models = self.ppo, self.models
        name = self.generation.generation_backend
        if (
            name != "auto"
            and not backend_info(name).records_logprobs
            and ppo.rollout_correction not in ("auto", "none")
        ):
            raise ValueError(
                f"--rollout_correction {ppo.rollout_correction} weights pi_old against the "
                f"rollout engine's record of log-probs; --generation_backend {name} records none "
                "(use static or auto, or leave --rollout_correction out)"
            )
        check_macro_credit(self.macro, ppo)
        check_env_flags(
            self.env,
            termination_condition=self.macro.termination_condition,
            advantage_estimator=ppo.advantage_estimator,
            data_path=self.data.data_path,
            dense_reward=ppo.dense_reward,
            custom_reward=self.reward.custom,
            reward_source=self.reward_source,
            reward_source_flag=ppo.reward_source,
            eval_interval=self.log.eval_interval,
            unsup_coef=ppo.unsup_coef,
            unsup_data_path=ppo.unsup_data_path,
            generation_backend=self.generation.generation_backend,
            max_prompt_seq_len=self.generation.max_prompt_seq_len,
        )
        if self.env.env is None or reward_sources.source_names(self.reward_source):
            reward_sources.check_reward_flags(
                self.reward_source, self.reward,
                None if ppo.needs_critic else ppo.advantage_estimator,
                bool(models.reward_model_name_or_path or models.critic.model.model_name_or_path),
            )  # fmt: skip


def check_macro_credit(macro: MacroConfig, ppo: PPOConfig) -> None:
    """``--macro_credit boundary`` places per-macro advantages on boundary tokens: only the
    estimators that make one advantage per macro action (``per_macro``: ``gae``, ``macro_mc``) have
    them, and the mask selects tokens, so the ratio must be per token."""
    if macro.macro_credit == "all":
        return
    if not estimator_class(ppo.advantage_estimator).per_macro:
        per_macro = " or ".join(n for n, c in ESTIMATORS.items() if c.per_macro)
        raise ValueError(
            f"--macro_credit {macro.macro_credit} needs per-macro-action advantages: "
            f"--advantage_estimator {per_macro} (got {ppo.advantage_estimator}, which gives "
            "one advantage per response)"
        )
    if ppo.ratio_level != "token":
        raise ValueError(
            f"--macro_credit {macro.macro_credit} trains each macro action's boundary token with "
            f"its own ratio: use --ratio_level token (got {ppo.ratio_level})"
        )
