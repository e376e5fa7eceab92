"""Stage 1's configuration (:mod:`marlhf.stages.sft.train`): the shared parts, whole. It imports no torch,
so that ``marlhf sft --help`` and the flags' validation are quick."""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.config import BatchingConfig, DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.data.config import DataConfig


@dataclass
class SFTConfig:
    """Stage 1: supervised fine-tuning (SFT)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ds: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        self.model.check_lora()
