"""The reward model on the eval split (accuracy, Bradley–Terry loss, score statistics, summed over
ranks) and the fit of a segment RM's location-aware normaliser.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from marlhf.algo.bradley_terry import bt_loss, split_pair
from marlhf.rewards.segment import (
    ScoreStats,
    fit_location_normalizer,
    segment_positions,
    segment_readout,
)
from marlhf.runtime.batching import padded_eval_shard
from marlhf.runtime.distributed import all_reduce_sum, rank, world_size
from marlhf.stages.common import to_device
from marlhf.stages.reward.scorer import Scorer, pair_responses


def _shard(n: int, batch: int, max_batches: int = 0) -> list[tuple[list[int], bool]]:
    """This rank's evaluation batches as ``(indices, real)``, as many on every rank (ZeRO-3's
    collective parameter gathers stay in step; see ``padded_eval_shard``)."""
    return padded_eval_shard(n, batch, world_size(), rank(), max_batches)


# Sums accumulated over evaluation batches, all-reduced as one float64 vector.
_SUMS = ("pairs", "loss", "wins", "chosen", "rejected", "score_sq", "end", "end_sq")


@torch.no_grad()
def evaluate(
    engine, dataset, collate, scorer: Scorer, max_batches: int
) -> tuple[dict[str, float], Any]:
    """Pairwise metrics over the eval split (all ranks) and the end-score statistics.

    Returns ``({"eval/accuracy", "eval/chosen_mean", "eval/rejected_mean", "eval/score_std",
    "eval/loss"}, ScoreStats of the end scores of all 2N responses)``. Accuracy counts a tie as half.
    """
    optim = scorer.optim
    engine.eval()
    acc = torch.zeros(len(_SUMS), dtype=torch.float64)
    gen = torch.Generator().manual_seed(
        optim.seed
    )  # the `randomized` rule: the same cuts every eval
    for idx, real in _shard(len(dataset), optim.per_device_eval_batch_size, max_batches):
        batch = to_device(collate([dataset[i] for i in idx]), engine.device)
        scores, ends, _ = scorer.scores(engine, batch, gen)
        if not real:
            continue
        chosen, rejected = split_pair(scores.float())
        n = chosen.shape[0]
        loss = bt_loss(chosen, rejected, scorer.margin(batch), scorer.reward.center_rewards_coef)
        wins = (chosen > rejected).double() + 0.5 * (chosen == rejected).double()
        e = ends.double()
        acc += torch.stack(
            [
                torch.tensor(float(n), dtype=torch.float64),
                loss.double().cpu() * n,
                wins.sum().cpu(),
                chosen.double().sum().cpu(),
                rejected.double().sum().cpu(),
                scores.double().pow(2).sum().cpu(),
                e.sum().cpu(),
                e.pow(2).sum().cpu(),
            ]
        )
    engine.train()
    s = dict(zip(_SUMS, all_reduce_sum(acc).tolist(), strict=True))
    n = max(s["pairs"], 1.0)
    mean = (s["chosen"] + s["rejected"]) / (2 * n)
    end_mean = s["end"] / (2 * n)
    metrics = {
        "eval/accuracy": s["wins"] / n,
        "eval/chosen_mean": s["chosen"] / n,
        "eval/rejected_mean": s["rejected"] / n,
        "eval/score_std": math.sqrt(max(s["score_sq"] / (2 * n) - mean**2, 0.0)),
        "eval/loss": s["loss"] / n,
    }
    stats = ScoreStats(mean=end_mean, std=math.sqrt(max(s["end_sq"] / (2 * n) - end_mean**2, 0.0)))
    return metrics, stats


def _gather_cat(x: torch.Tensor) -> torch.Tensor:
    """Concatenate a 1-d CPU tensor of any length over ranks (rank order)."""
    if world_size() == 1:
        return x
    parts: list = [None] * world_size()
    torch.distributed.all_gather_object(parts, x.cpu())
    return torch.cat(parts)


@torch.no_grad()
def fit_normalizer(engine, dataset, collate, scorer: Scorer):
    """Location-aware normaliser fitted over the segment rewards of chosen responses (all ranks).

    Uses the first ``--normalizer_max_samples`` pairs of ``dataset`` (all with 0).
    """
    n, optim = len(dataset), scorer.optim
    if scorer.reward.normalizer_max_samples:
        n = min(n, scorer.reward.normalizer_max_samples)
    engine.eval()
    rewards, positions = [], []
    gen = torch.Generator().manual_seed(optim.seed)
    for idx, real in _shard(n, optim.per_device_eval_batch_size):
        batch = to_device(collate([dataset[i] for i in idx]), engine.device)
        values = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        responses = pair_responses(
            batch["input_ids"],
            batch["attention_mask"],
            batch["prompt_len"],
            scorer.pad_id,
            scorer.eot_id,
        )
        macro_end = scorer.macro_end(batch, responses, gen)
        r, mask = segment_readout(
            values, responses.response_start, macro_end, responses.action_mask
        )
        if not real:
            continue
        half = r.shape[0] // 2  # chosen rows only
        r, mask = r[:half], mask[:half]
        rewards.append(r[mask].float().cpu())
        positions.append(segment_positions(mask)[mask].float().cpu())
    engine.train()
    r = _gather_cat(torch.cat(rewards) if rewards else torch.zeros(0))
    p = _gather_cat(torch.cat(positions) if positions else torch.zeros(0))
    return fit_location_normalizer(r, p)
