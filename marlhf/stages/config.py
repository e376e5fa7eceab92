"""The parts every supervised stage's configuration has (SFT, reward model), so that the shared
set-up (:func:`marlhf.stages.common.setup_supervised`) and loop take any of them. It imports no
torch, as no stage's configuration does."""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.config import BatchingConfig, DeepSpeedConfig, LoggingConfig, ModelConfig, OptimConfig
from marlhf.data.config import DataConfig


@dataclass
class SupervisedConfig:
    """A supervised stage: the model, its data, optimisation, DeepSpeed, logging and batching."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ds: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        self.model.check_lora()
