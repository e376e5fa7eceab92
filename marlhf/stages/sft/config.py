"""Stage 1's configuration (:mod:`marlhf.stages.sft.train`): the supervised stages' parts, whole. It
imports no torch, so that ``marlhf sft --help`` and the flags' validation are quick."""

from __future__ import annotations

from dataclasses import dataclass

from marlhf.stages.config import SupervisedConfig


@dataclass
class SFTConfig(SupervisedConfig):
    """Stage 1: supervised fine-tuning (SFT)."""
