"""The reward-model stage's configuration: the supervised stages' parts (model, data, optimisation,
DeepSpeed, logging, batching), the objective (end or segment score, Bradley–Terry options, the
normaliser fit) and, for a segment RM, the macro-action rule that cuts responses into segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.config import check_own_numbers, flag
from marlhf.macro.config import MacroConfig
from marlhf.models.config import RM_TYPES
from marlhf.stages.config import SupervisedConfig

NORMALIZER_SPLITS = ("train", "eval")


@dataclass
class RewardConfig:
    """Reward-model objective: end or segment score, Bradley–Terry options, normaliser fit."""

    rm_type: str = flag(
        "end",
        "`end`: score = value at the last token; `segment` (Segment-PPO): score = mean "
        "of the values at the last token of each segment cut by --termination_condition.",
        choices=RM_TYPES,
    )
    use_margin: bool = flag(
        False, "Subtract the data's `margin` column from the score gap (rows without one: 0)."
    )
    center_rewards_coef: float = flag(
        0.0,
        "Weight of the reward-centering penalty mean((r_c + r_r)^2) (0: off).",
        range="[0, inf)",
    )
    reference_model_name_or_path: str | None = flag(
        None,
        "Frozen SFT model whose entropies / log-probs the `entropy` / `ppl` rules read "
        "(segment RM only); default: --model_name_or_path.",
    )
    normalizer_split: str = flag(
        "train",
        "Segment RM: split whose chosen responses fit the location-aware normaliser.",
        choices=NORMALIZER_SPLITS,
    )
    normalizer_max_samples: int = flag(
        4096, "Segment RM: at most this many chosen responses for the normaliser fit (0: all)."
    )
    init_value_head: bool = flag(
        False,
        "Start from the value head saved with --model_name_or_path "
        "(value_head.safetensors, e.g. tiny-rm-base's, preference-pretrained) instead of a "
        "fresh one.",
    )
    num_padding_at_beginning: int = flag(
        0,
        "Accepted for compatibility with the original scripts and ignored: it skipped "
        "OPT's leading padding token; the end score here is read from the attention mask, "
        "which needs no such offset for any model.",
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        if self.rm_type not in RM_TYPES:
            raise ValueError(f"--rm_type must be one of {RM_TYPES}, got {self.rm_type!r}")
        if self.normalizer_split not in NORMALIZER_SPLITS:
            raise ValueError(f"--normalizer_split must be one of {NORMALIZER_SPLITS}")
        if self.normalizer_max_samples < 0:
            raise ValueError(
                f"--normalizer_max_samples must be >= 0, got {self.normalizer_max_samples}"
            )
        if self.num_padding_at_beginning < 0:
            raise ValueError(
                f"--num_padding_at_beginning must be >= 0, got {self.num_padding_at_beginning}"
            )


@dataclass
class RewardStageConfig(SupervisedConfig):
    """Stage 2: reward-model training (Bradley–Terry on end or segment scores)."""

    reward: RewardConfig = field(default_factory=RewardConfig)
    macro: MacroConfig = field(default_factory=MacroConfig)
