"""``--reward_source gold``: a synthetic task's gold score of each response (an oracle reward for
experiments; the stage finds the task's scorer from ``--data_path``: synthetic-tldr and the
long-horizon synthetic-facts-* / synthetic-verdict-* prompts). Declared in
:mod:`marlhf.rewards.registry`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from marlhf.rewards.registry import RewardContext
from marlhf.rewards.terms import RewardBatch, RewardTerm


@dataclass(frozen=True)
class GoldScore:
    """``oracle(prompt, response)`` of each row, (B,)."""

    oracle: Callable[[str, str], float]

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        if len(batch.prompts) != len(batch):
            raise ValueError("an oracle reward needs one prompt text per response")
        pairs = zip(batch.prompts, batch.completions, strict=True)
        values = torch.tensor([float(self.oracle(p, r)) for p, r in pairs])
        return [RewardTerm("gold", values, log_mean=False)]


def build_source(ctx: RewardContext) -> GoldScore:
    """The ``gold`` source of a run: the task's scorer ``ctx.oracle``."""
    if ctx.oracle is None:
        raise ValueError(
            "--reward_source gold needs a synthetic task's prompts (--data_path synthetic-tldr, "
            "synthetic-facts-16|64|256 or synthetic-verdict-16|64|256): the gold score is only "
            "defined there"
        )
    return GoldScore(ctx.oracle)
