"""Preference-model pretraining (PMP) of a reward model on generated K-wise comparisons.

Askell et al. (2021) pretrain a preference model on many comparisons before fine-tuning it on the
task's own; InstructGPT (Ouyang et al., 2022) trains on all ``K choose 2`` comparisons of a prompt's
``K`` ranked answers as one batch element, which gives many labelled pairs per forward pass and does
not overfit the way single pairs do. Here each post of the bundled synthetic task
(:func:`marlhf.data.synthetic.generate_groups`) comes with one candidate summary per kind and a
Bradley-Terry label for every pair of them, drawn as the task's labellers draw theirs: the model learns
from preference labels only, never from the gold score itself.

Loss of a batch of groups (``N`` sequences, ``P`` labelled pairs ``(winner, loser)``)::

    loss = mean_p  -log sigmoid(r[winner_p] - r[loser_p])

with ``r`` the end score (value at the last token, :func:`marlhf.models.reward_model.end_scores`), the
score PPO reads.

>>> import torch
>>> scores = torch.tensor([2.0, 0.0, 1.0])
>>> loss, acc = kwise_bt_loss(scores, torch.tensor([[0, 1], [2, 1], [1, 0]]))
>>> round(float(loss), 4), round(float(acc), 4)
(0.8557, 0.6667)
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from marlhf.data.collate import pad
from marlhf.data.synthetic import generate_groups, gold_score, prompt_of
from marlhf.data.tokenize import bos_prefix
from marlhf.models.reward_model import end_scores


@dataclasses.dataclass(frozen=True)
class PMPPhase:
    """One phase: ``steps`` optimiser steps on ``posts`` generated posts each (all pairs of their
    candidates of ``kinds``), AdamW at ``lr`` with linear warm-up over ``warmup_ratio`` of the steps
    and cosine decay to 0, gradients clipped at norm 1."""

    kinds: tuple[str, ...]
    steps: int
    lr: float = 3e-4
    posts: int = 4
    warmup_ratio: float = 0.03


def kwise_bt_loss(scores: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores: (N,)``, ``pairs: (P, 2) long`` (winner, loser) -> (mean BT loss, share of pairs
    ordered right), both scalars."""
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        raise ValueError(f"kwise_bt_loss: pairs must be (P, 2), got {tuple(pairs.shape)}")
    margin = scores[pairs[:, 0]] - scores[pairs[:, 1]]  # (P,)
    return -F.logsigmoid(margin).mean(), (margin > 0).float().mean()


def encode(tokenizer, prompt: str, text: str) -> list[int]:
    """``bos + prompt + response + eos`` as the reward stage encodes a comparison's response."""
    ids = tokenizer([prompt, text], add_special_tokens=False)["input_ids"]
    return [*bos_prefix(tokenizer), *ids[0], *ids[1], tokenizer.eos_token_id]


def group_batch(tokenizer, groups: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids, attention_mask: (N, T)`` of every candidate of ``groups`` and their
    labelled ``pairs: (P, 2)`` as row indices of the batch."""
    seqs: list[list[int]] = []
    pairs: list[tuple[int, int]] = []
    for g in groups:
        offset = len(seqs)
        seqs += [encode(tokenizer, g["prompt"], t) for t in g["texts"]]
        pairs += [(offset + w, offset + lo) for w, lo in g["pairs"]]
    ids = pad(seqs, tokenizer.pad_token_id)
    mask = pad([[1] * len(s) for s in seqs], 0)
    return ids, mask, torch.tensor(pairs, dtype=torch.long)


@torch.no_grad()
def heldout_accuracy(model, tokenizer, rows: list[dict], batch: int = 32) -> dict[str, float]:
    """Pairwise accuracy of ``model`` (a :class:`~marlhf.models.reward_model.RewardModel`) on comparisons in
    the TL;DR schema: against their labels, and against the gold order (pairs of unequal gold)."""
    was_training = model.training
    model.eval()
    labels, gold = [], []
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        seqs = [encode(tokenizer, prompt_of(r), s["text"]) for r in chunk for s in r["summaries"]]
        ids, mask = pad(seqs, tokenizer.pad_token_id), pad([[1] * len(s) for s in seqs], 0)
        scores = end_scores(model(ids, mask), mask).view(-1, 2).tolist()
        for r, (s0, s1) in zip(chunk, scores, strict=True):
            labels.append((s0 > s1) == (r["choice"] == 0))
            g0, g1 = (gold_score(prompt_of(r), s["text"]) for s in r["summaries"])
            if g0 != g1:
                gold.append((s0 > s1) == (g0 > g1))
    model.train(was_training)
    return {"accuracy": statistics.fmean(labels), "gold_accuracy": statistics.fmean(gold)}


def _schedule(phase: PMPPhase) -> Callable[[int], float]:
    warm = max(1, int(phase.warmup_ratio * phase.steps))
    return lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / phase.steps))


def pretrain(
    model,
    tokenizer,
    phases: list[PMPPhase],
    seed: int,
    heldout: list[dict],
    eval_every: int = 250,
    log: Callable[[dict], Any] = lambda r: print(json.dumps(r), flush=True),
) -> list[dict]:
    """Train ``model`` (a :class:`~marlhf.models.reward_model.RewardModel`, in place) through ``phases`` on
    :func:`~marlhf.data.synthetic.generate_groups` posts (phase ``k`` reads seed ``seed + k``);
    every ``eval_every`` steps and at the end of each phase, :func:`heldout_accuracy` on ``heldout``.
    Returns the logged records (``phase``, ``step``, running train pair accuracy, held-out figures,
    seconds)."""
    torch.manual_seed(seed)
    records: list[dict] = []
    t0 = time.time()
    model.train()
    for k, phase in enumerate(phases):
        groups = generate_groups(phase.steps * phase.posts, seed + k, tuple(phase.kinds))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=phase.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(phase))
        hits: list[float] = []
        for step in range(1, phase.steps + 1):
            chunk = groups[(step - 1) * phase.posts : step * phase.posts]
            ids, mask, pairs = group_batch(tokenizer, chunk)

            loss, acc = kwise_bt_loss(end_scores(model(ids, mask), mask), pairs)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            hits.append(float(acc))
            if step % eval_every == 0 or step == phase.steps:
                record = {"phase": k, "kinds": ",".join(phase.kinds), "step": step}
                record["train_pair_accuracy"] = round(statistics.fmean(hits[-eval_every:]), 4)
                record.update(
                    {
                        k_: round(v, 4)
                        for k_, v in heldout_accuracy(model, tokenizer, heldout).items()
                    }
                )
                record["seconds"] = round(time.time() - t0, 1)
                records.append(record)
                log(record)
    return records
