"""Typed configuration of stage 3 (MA-PPO). Flag names follow the original step-3 script."""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.algo.estimators import ESTIMATOR_ALIASES, ESTIMATORS, resolve_estimator
from marlhf.algo.kl_rewards import KL_ESTIMATORS
from marlhf.algo.losses import LOSS_AGG_MODES, RATIO_LEVELS
from marlhf.algo.mismatch import CORRECTIONS
from marlhf.config import BatchingConfig, DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.data.config import DataConfig
from marlhf.macro.config import MacroConfig
from marlhf.models.vllm_engine import VLLMConfig
from marlhf.rewards.code import CodeRewardConfig
from marlhf.runtime.length_groups import Grouping

GENERATION_BACKENDS = ("auto", "hf", "static", "vllm")

# the flags of the shared parts that differ between the actor and the critic (prefixed actor_ and
# critic_), and those the models share (one flag each, as in SFT and RM)
PER_MODEL_FLAGS = (
    "model_name_or_path",
    "gradient_checkpointing",
    "dropout",
    "lora_dim",
    "lora_module_name",
)


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
SHARED_MODEL_FLAGS = ("trust_remote_code", "dtype", "only_optimize_lora")
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
            "reward model (--reward_source gold or code). The critic defaults to the actor's model.",
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
            "help": {"only_optimize_lora": "Train only the LoRA weights of the models with LoRA."},
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

    @property
    def effective_dtype(self) -> str:
        return "bf16" if self.bf16 else self.shared.dtype

    def __post_init__(self) -> None:
        if self.bf16 and self.shared.dtype not in ("fp32", "bf16"):
            raise ValueError(f"--bf16 contradicts --dtype {self.shared.dtype}")
        if self.critic_value_head not in ("auto", "trained", "fresh"):
            raise ValueError("--critic_value_head must be auto, trained or fresh")


def ppo_optim(**overrides) -> OptimConfig:
    """PPO's schedule and optimisation settings: an :class:`~marlhf.config.OptimConfig` whose
    learning-rate schedule defaults to ``linear`` (``overrides``: its other fields)."""
    return OptimConfig(**{"lr_scheduler_type": "linear", **overrides})


# the optimisation flags the actor and critic share; each model's own are in TrainedModelConfig
PPO_OPTIM_FLAGS = (
    "lr_scheduler_type",
    "num_warmup_steps",
    "warmup_ratio",
    "max_grad_norm",
    "num_train_epochs",
    "max_steps",
    "gradient_accumulation_steps",
    "seed",
)


@dataclass
class GenerationConfig:
    """Rollout generation."""

    max_prompt_seq_len: int = field(
        default=256,
        metadata={"help": "Prompt tokens (left-padded).", "aliases": ("--max_prompt_len",)},
    )
    max_answer_seq_len: int = field(
        default=256,
        metadata={"help": "Maximum new tokens per response.", "aliases": ("--max_new_tokens",)},
    )
    overlong_prompts: str = field(
        default="drop",
        metadata={
            "help": "Prompts longer than --max_prompt_seq_len: `drop` (the original) or `truncate` "
            "(keep the last tokens). Either way they are counted and logged.",
            "choices": ("drop", "truncate"),
        },
    )
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature."})
    top_k: int = field(default=50, metadata={"help": "Top-k sampling (0: off)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
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
    generation_backend: str = field(
        default="auto",
        metadata={
            "help": "Rollout decoder: `hf` (model.generate; each rank samples from its own RNG "
            "stream, so samples depend on how the batch is split over ranks), `static` "
            "(marlhf.models.decode: static KV cache, on-device sampling, each row's noise seeded from "
            "(--seed, step, its row in the global batch): the same samples on any number of ranks; "
            "it also records the sampled tokens' log-probs, so scoring skips one actor forward), "
            "or `auto` (default): `static` for full-attention Llama/Gemma/Mistral/Qwen models "
            "(not under ZeRO-3 without --enable_zero3_generation_gather), else `hf`; or `vllm` "
            "(a vLLM engine in each rank's process, seeded per row like `static`, loaded with the "
            "actor's weights after every update; needs vLLM installed, `auto` never picks it). "
            "They sample the same distribution with different random draws.",
            "choices": GENERATION_BACKENDS,
        },
    )
    compile_generation: bool = field(
        default=False,
        metadata={
            "help": "With --generation_backend static on CUDA: CUDA-graph the decode step (torch.compile)."
        },
    )
    # the engine of --generation_backend vllm (flags --vllm_*; ignored by the other backends)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    print_answers: bool = field(
        default=False, metadata={"help": "Print sample responses with macro actions."}
    )
    print_answers_interval: int = field(default=10, metadata={"help": "Every N PPO steps."})

    def __post_init__(self) -> None:
        for name in (
            "max_prompt_seq_len",
            "max_answer_seq_len",
            "per_device_generation_batch_size",
            "generation_batches",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")
        if self.generation_backend not in GENERATION_BACKENDS:
            raise ValueError(f"--generation_backend must be one of {GENERATION_BACKENDS}")
        if self.temperature <= 0:
            raise ValueError("--temperature must be > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("--top_p must be in (0, 1]")


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
    cliprange: float = field(default=0.2, metadata={"help": "Policy ratio clip."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Value clip around old values."})
    gamma: float = field(default=1.0, metadata={"help": "GAE discount (over macro actions)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (over macro actions)."})
    kl_ctl: float = field(
        default=0.05, metadata={"help": "KL penalty coefficient (initial if adaptive)."}
    )
    kl_estimator: str = field(
        default="k1", metadata={"help": "Per-token KL estimator.", "choices": ("k1", "k2", "k3")}
    )
    target_kl: float | None = field(
        default=None, metadata={"help": "Adaptive KL controller target (None: fixed)."}
    )
    kl_horizon: int = field(default=10000, metadata={"help": "Adaptive KL horizon (samples)."})
    reward_clip: float = field(
        default=2.5, metadata={"help": "Clip the reward-model score to ±this (0: off)."}
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
        default="rm",
        metadata={
            "help": "`rm`, `code` (execute against test cases, APPS), `rm+code`, or `gold`: the "
            "synthetic task's gold score (an oracle reward for experiments: synthetic-tldr and the "
            "long-horizon synthetic-facts-*/synthetic-verdict-* prompts only).",
            "choices": ("rm", "code", "rm+code", "gold"),
        },
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
        metadata={
            "help": "How advantages are made (marlhf.algo.estimators): `gae` (the critic, GAE over "
            "macro actions), `grpo` (group-normalised outcome over --n_samples_per_prompt "
            "samples), `dr_grpo` (no std division, constant loss normaliser), `rloo` "
            "(leave-one-out baseline), `reinforce_pp` (REINFORCE++: KL in the reward, returns "
            "whitened over the batch) or `macro_mc` (Monte-Carlo values at macro-action "
            "boundaries: --mc_rollouts continuations of the current policy). Only `gae` builds a "
            f"critic. Aliases: {', '.join(f'{a}={c}' for a, c in sorted(ESTIMATOR_ALIASES.items()))}."
        },
    )
    n_samples_per_prompt: int = field(
        default=1,
        metadata={
            "help": "G: responses sampled per prompt. A step's rollout holds (rollout size x "
            "ranks) / G distinct prompts, each sampled G times; a group is never split by the "
            "estimate (it runs on the gathered batch). grpo, dr_grpo and rloo need G >= 2."
        },
    )
    mc_rollouts: int = field(
        default=4,
        metadata={
            "help": "`macro_mc`: K continuations drawn from the current policy at each chosen "
            "macro-action boundary; the mean of their sequence rewards is V(boundary)."
        },
    )
    mc_max_boundaries: int = field(
        default=4,
        metadata={
            "help": "`macro_mc`: at most this many interior boundaries per response, placed by "
            "--mc_boundary_selection (the macro actions in between share one advantage; 0: the "
            "response is one credit segment)."
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
            "--max_answer_seq_len / (--mc_max_boundaries + 1), rounded up)."
        },
    )
    mc_generation_batch_size: int = field(
        default=0,
        metadata={
            "help": "`macro_mc`: continuations per generate call (0: --per_device_generation_"
            "batch_size x --mc_rollouts)."
        },
    )
    loss_agg_mode: str | None = field(
        default=None,
        metadata={
            "help": "How the policy loss reduces its terms (verl's names): token-mean (every "
            "token or macro action weighs the same), seq-mean-token-sum, seq-mean-token-mean "
            "(every response weighs the same) or seq-mean-token-sum-norm (Dr. GRPO: token sums "
            "divided by --max_answer_seq_len). Default: the estimator's own (dr_grpo: "
            "seq-mean-token-sum-norm), else token-mean. The value loss stays token-mean.",
            "choices": LOSS_AGG_MODES,
        },
    )
    kl_loss_coef: float = field(
        default=0.0,
        metadata={
            "help": "KL to the reference as a loss term of the actor (GRPO paper; verl's "
            "use_kl_loss), coefficient of agg(KL_t) reduced like the policy loss; usually with "
            "--kl_ctl 0 (no KL in the reward). 0: off."
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
            "[1/C, C] (> 1)."
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
    ema_decay: float = field(default=0.992, metadata={"help": "EMA decay."})
    unsup_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of the pretraining/SFT LM loss mixed into the actor update."},
    )
    unsup_data_path: tuple[str, ...] = field(
        default=(), metadata={"help": "SFT data for --unsup_coef (default: --data_path)."}
    )

    def __post_init__(self) -> None:
        for name in ("ppo_epochs", "per_device_training_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")
        if not 0 <= self.lam <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError("--gamma and --lam must be in [0, 1]")
        if self.cliprange <= 0 or self.cliprange_value <= 0:
            raise ValueError("--cliprange and --cliprange_value must be > 0")
        if self.kl_ctl < 0:
            raise ValueError("--kl_ctl must be >= 0")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ValueError("--target_kl must be > 0")
        if not 0 < self.ema_decay < 1:
            raise ValueError("--ema_decay must be in (0, 1)")
        if self.rollout_correction not in ("auto", *CORRECTIONS):
            raise ValueError(
                f"--rollout_correction must be auto or one of {CORRECTIONS}, "
                f"got {self.rollout_correction!r}"
            )
        if not self.rollout_is_cap > 1.0:
            raise ValueError(f"--rollout_is_cap must be > 1, got {self.rollout_is_cap}")
        self._check_estimator()

    def _check_estimator(self) -> None:
        """The estimator's flags: its name, G, the Monte-Carlo settings, the loss aggregation."""
        name = resolve_estimator(self.advantage_estimator)  # ValueError listing the names
        est = ESTIMATORS[name]
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(
                f"--ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}"
            )
        if self.n_samples_per_prompt < 1:
            raise ValueError(
                f"--n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}"
            )
        if name in ("grpo", "dr_grpo", "rloo") and self.n_samples_per_prompt < 2:
            raise ValueError(
                f"--advantage_estimator {self.advantage_estimator} compares the samples of one "
                "prompt: set --n_samples_per_prompt to 2 or more (got "
                f"{self.n_samples_per_prompt})"
            )
        if self.mc_rollouts < 1:
            raise ValueError(f"--mc_rollouts must be >= 1, got {self.mc_rollouts}")
        if self.mc_max_boundaries < 0:
            raise ValueError(f"--mc_max_boundaries must be >= 0, got {self.mc_max_boundaries}")
        if self.mc_boundary_selection not in ("spaced", "spread"):
            raise ValueError(
                "--mc_boundary_selection must be one of ('spaced', 'spread'), got "
                f"{self.mc_boundary_selection!r}"
            )
        if self.mc_boundary_spacing < 0:
            raise ValueError(
                f"--mc_boundary_spacing must be >= 0 (0: automatic), got {self.mc_boundary_spacing}"
            )
        if self.mc_generation_batch_size < 0:
            raise ValueError(
                f"--mc_generation_batch_size must be >= 0, got {self.mc_generation_batch_size}"
            )
        if name == "macro_mc" and self.gamma != 1.0:
            raise ValueError(
                f"--advantage_estimator macro_mc is undiscounted: --gamma must be 1, got {self.gamma}"
            )
        own = est.loss_agg_mode
        if self.loss_agg_mode is not None and self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"--loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}"
            )
        if own is not None and self.loss_agg_mode not in (None, own):
            raise ValueError(
                f"--advantage_estimator {name} is defined with --loss_agg_mode {own}; "
                f"--loss_agg_mode {self.loss_agg_mode} contradicts it (leave it out)"
            )
        if self.kl_loss_coef < 0:
            raise ValueError(f"--kl_loss_coef must be >= 0, got {self.kl_loss_coef}")
        if self.kl_loss_type not in KL_ESTIMATORS:
            raise ValueError(f"--kl_loss_type must be one of {KL_ESTIMATORS}")
        if not est.needs_critic and self.critic_warmup_steps > 0:
            raise ValueError(
                f"--critic_warmup_steps {self.critic_warmup_steps}: --advantage_estimator {name} "
                "trains no critic"
            )

    @property
    def estimator(self) -> str:
        """The canonical name of ``--advantage_estimator`` (aliases resolved)."""
        return resolve_estimator(self.advantage_estimator)

    @property
    def needs_critic(self) -> bool:
        """Whether the estimator reads a critic (else none is built, loaded or saved)."""
        return ESTIMATORS[self.estimator].needs_critic

    @property
    def needs_mc(self) -> bool:
        """Whether the estimator reads Monte-Carlo values (``macro_mc``)."""
        return ESTIMATORS[self.estimator].needs_mc

    @property
    def policy_loss_agg_mode(self) -> str:
        """``--loss_agg_mode``, else the estimator's own, else token-mean."""
        return self.loss_agg_mode or ESTIMATORS[self.estimator].loss_agg_mode or "token-mean"


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
            "model costs about what 64 tokens do; raise it for GPUs and large models)."
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
        if self.mismatch_check_every < 0:
            raise ValueError(
                f"--mismatch_check_every must be >= 0, got {self.mismatch_check_every}"
            )
        if self.length_groups < 1:
            raise ValueError(f"--length_groups must be >= 1, got {self.length_groups}")
        if self.length_group_call_tokens < 0:
            raise ValueError(
                f"--length_group_call_tokens must be >= 0, got {self.length_group_call_tokens}"
            )

    @property
    def grouping(self):
        """The score and update passes' :class:`marlhf.runtime.length_groups.Grouping`."""
        args = (self.length_groups, self.length_group_call_tokens)
        return Grouping(*args, self.batching.packing, self.batching.max_tokens_per_micro_batch)


@dataclass
class PPOStageConfig:
    """Stage 3: MA-PPO (PPO over macro actions)."""

    models: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)
    data: DataConfig = field(default_factory=DataConfig)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)

    @property
    def correction(self) -> str:
        """``--rollout_correction`` with ``auto`` resolved for the dtype: ``none`` in fp32 (the
        decoder's record is the trainer's forward to float rounding), ``tis`` in half precision."""
        mode = self.ppo.rollout_correction
        if mode != "auto":
            return mode
        return "none" if self.models.effective_dtype == "fp32" else "tis"

    def __post_init__(self) -> None:
        ppo, mc = self.ppo, self.models
        if self.generation.generation_backend == "hf" and ppo.rollout_correction not in (
            "auto",
            "none",
        ):
            raise ValueError(
                f"--rollout_correction {ppo.rollout_correction} weights pi_old against the "
                "rollout engine's record of log-probs; --generation_backend hf records none "
                "(use static or auto, or leave --rollout_correction out)"
            )
        check_macro_credit(self.macro, ppo)
        if (
            not ppo.needs_critic
            and ppo.reward_source in ("rm", "rm+code")
            and not (mc.reward_model_name_or_path or mc.critic.model.model_name_or_path)
        ):
            raise ValueError(
                f"--advantage_estimator {ppo.advantage_estimator} trains no critic, but "
                f"--reward_source {ppo.reward_source} needs the reward model: pass "
                "--reward_model_name_or_path (or --critic_model_name_or_path, its default)"
            )


def check_macro_credit(macro: MacroConfig, ppo: PPOConfig) -> None:
    """``--macro_credit boundary`` places per-macro advantages on boundary tokens: only the
    estimators that make one advantage per macro action (``gae``, ``macro_mc``) have them, and the
    mask selects tokens, so the ratio must be per token."""
    if macro.macro_credit == "all":
        return
    if ppo.estimator not in ("gae", "macro_mc"):
        raise ValueError(
            f"--macro_credit {macro.macro_credit} needs per-macro-action advantages: "
            f"--advantage_estimator gae or macro_mc (got {ppo.advantage_estimator}, which gives "
            "one advantage per response)"
        )
    if ppo.ratio_level != "token":
        raise ValueError(
            f"--macro_credit {macro.macro_credit} trains each macro action's boundary token with "
            f"its own ratio: use --ratio_level token (got {ppo.ratio_level})"
        )
