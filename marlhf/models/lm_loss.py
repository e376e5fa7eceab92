"""Causal-LM loss as a (sum, count) pair, so a batch split across micro-batches and ranks can be
normalised by the global token count (the loss then does not depend on how the batch was split)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL and the number of supervised tokens.

    logits: (B, T, V) — position t predicts token t+1.
    labels: (B, T) long — the input ids with -100 where no loss is taken (prompt, padding).
    Returns (nll_sum: () float32, count: () long).

    >>> logits = torch.zeros(1, 3, 4)            # uniform over 4 tokens
    >>> labels = torch.tensor([[-100, 2, 3]])      # two supervised tokens
    >>> s, n = lm_loss_sum(logits, labels)
    >>> round(float(s / n), 4), int(n)             # ln 4
    (1.3863, 2)
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    nll = F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)),
        shift_labels.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    return nll, (shift_labels != -100).sum()
