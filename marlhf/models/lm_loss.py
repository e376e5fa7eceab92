"""Causal-LM loss as a (sum, count) pair, so a batch split across micro-batches and ranks can be
normalised by the global token count (the loss then does not depend on how the batch was split)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from marlhf.models.packing import pack_rows, packed_inputs, packing_mode, packs

IGNORE_INDEX = -100


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


def causal_lm_loss_sum(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    *,
    packing: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`lm_loss_sum` of ``model`` (a causal LM or its DeepSpeed engine) on a padded batch.

    input_ids, attention_mask, labels: (B, T). With ``packing``, where the model runs packed rows
    exactly (:func:`marlhf.models.packing.packing_mode`), the rows go through it packed: their
    labels are packed alike, each row's first label is dropped (in the padded layout nothing
    predicts it) and the sum and count are the padded computation's up to float rounding.
    """
    mode = packing_mode(model) if packing else None
    if not packs(attention_mask, mode):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return lm_loss_sum(logits, labels)
    p = pack_rows(input_ids, attention_mask, layout=mode)
    packed_labels = p.pack(labels, IGNORE_INDEX).masked_fill(p.first_tokens(), IGNORE_INDEX)
    return lm_loss_sum(model(**packed_inputs(p)).logits, packed_labels)
