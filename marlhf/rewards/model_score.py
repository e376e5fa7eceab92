"""``--reward_source rm``: the frozen reward model's score at each response's last token, normalised
with its saved statistics under ``--normalize_reward`` (the stage runs the model; this source
reads its scores). Declared in :mod:`marlhf.rewards.registry`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marlhf.algo.kl_rewards import normalize_scores
from marlhf.rewards.registry import RewardContext, RewardError
from marlhf.rewards.terms import RewardBatch, RewardTerm


@dataclass(frozen=True)
class ModelScore:
    """The reward model's end scores ``batch.rm_scores`` (B,), normalised with ``score_stats``
    (its ``mean`` and ``std``) when ``normalize``."""

    normalize: bool = False
    score_stats: Any = None

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        rm = batch.rm_scores
        if rm is None:
            raise RewardError("--reward_source rm: the batch has no reward-model scores")
        if self.normalize and self.score_stats is not None:
            rm = normalize_scores(rm, self.score_stats.mean, self.score_stats.std)
        return [RewardTerm("rm", rm, log_mean=False)]


def build_source(ctx: RewardContext) -> ModelScore:
    """The ``rm`` source of a run (its normalisation from ``ctx``)."""
    return ModelScore(ctx.normalize, ctx.score_stats)
