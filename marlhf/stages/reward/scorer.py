"""Scores of a pair batch: the response part of each row (chosen rows, then rejected rows), and the
score of each response, the value at its last token (end RM) or the mean of the values at its
segments' last tokens (segment RM, whose rule may read a frozen reference model).

Shapes: ``B`` pairs, ``T`` full sequence, ``A`` response tokens, ``M`` segments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from marlhf.macro import termination_inputs
from marlhf.models.reward_model import end_scores, padded_values
from marlhf.models.sequences import response_logprobs_and_entropy
from marlhf.rewards.segment import (
    segment_readout,
    segment_score,
)
from marlhf.stages.reward.config import RewardStageConfig


@dataclass
class PairResponses:
    """The response part of each row of a stacked pair batch (chosen rows, then rejected rows).

    Fields:
        response_start: (2B,) long — position of response token 0 in the full sequence.
        response_ids: (2B, A) long — response tokens (end-of-conversation token included), pad after.
        action_mask: (2B, A) bool — response tokens, a prefix of each row.
        ends_with_eos: (2B,) bool — the response ends with the end-of-conversation token (not cut).
    """

    response_start: torch.Tensor
    response_ids: torch.Tensor
    action_mask: torch.Tensor
    ends_with_eos: torch.Tensor


def pair_responses(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: torch.Tensor,
    pad_id: int,
    eot_id: int,
) -> PairResponses:
    """Cut the responses out of a right-padded pair batch.

    Args:
        input_ids: (2B, T) long, right-padded; row i and row B + i share a prompt.
        attention_mask: (2B, T).
        prompt_len: (B,) long — where each pair's response starts (bos + prompt; see the collator).
        pad_id: filler for ``response_ids`` past each response.
        eot_id: last token id of the end-of-conversation token.

    >>> ids = torch.tensor([[2, 7, 8, 9, 1], [2, 7, 5, 1, 0]])  # bos=2, prompt 7, eot=1, pad=0
    >>> r = pair_responses(ids, (ids != 0).long(), torch.tensor([2]), pad_id=0, eot_id=1)
    >>> r.response_start.tolist(), r.response_ids.tolist(), r.action_mask.int().tolist()
    ([2, 2], [[8, 9, 1], [5, 1, 0]], [[1, 1, 1], [1, 1, 0]])
    >>> r.ends_with_eos.tolist()
    [True, True]
    """
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"pair_responses: input_ids {tuple(input_ids.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must both be (2B, T)"
        )
    two_b, T = input_ids.shape
    start = prompt_len.to(input_ids.device).long().repeat(2)  # (2B,) chosen rows, then rejected
    if start.shape[0] != two_b:
        raise ValueError(
            f"pair_responses: prompt_len must be (B,) = ({two_b // 2},), got {tuple(prompt_len.shape)}"
        )
    length = attention_mask.long().sum(dim=1)  # right padding: valid tokens are 0..length-1
    n_resp = (length - start).clamp(min=0)  # (2B,)
    A = max(int(n_resp.max()), 1) if two_b else 1
    j = torch.arange(A, device=input_ids.device).unsqueeze(0)  # (1, A)
    action_mask = j < n_resp.unsqueeze(1)  # (2B, A)
    pos = (start.unsqueeze(1) + j).clamp(max=T - 1)
    response_ids = input_ids.gather(1, pos).masked_fill(~action_mask, pad_id)
    last = response_ids.gather(1, (n_resp - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    ends = (n_resp > 0) & (last == eot_id)
    return PairResponses(start, response_ids, action_mask, ends)


def response_scores(
    values: torch.Tensor,
    attention_mask: torch.Tensor,
    responses: PairResponses | None = None,
    macro_end: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``(2B,)`` of the rows of a pair batch, and the segment mask ``(2B, M)`` (segment RM).

    End RM (``macro_end`` None): the value at the last non-padding token. Segment RM: the mean of the
    values at the last token of each segment (``macro_end: (2B, A) bool`` over ``responses``).
    ``values: (2B, T) float``.
    """
    if macro_end is None:
        return end_scores(values, attention_mask), None
    assert responses is not None
    rewards, seg_mask = segment_readout(
        values, responses.response_start, macro_end, responses.action_mask
    )
    return segment_score(rewards, seg_mask), seg_mask


@dataclass
class Scorer:
    """Everything needed to score a collated pair batch with the engine: the termination rule and the
    frozen reference model of a segment RM (None for an end RM)."""

    cfg: RewardStageConfig
    pad_id: int
    eot_id: int
    rule: Any = None  # termination rule (segment RM)
    ref: Any = None  # frozen reference engine (entropy / ppl rules)

    @property
    def segment(self) -> bool:
        return self.rule is not None

    def margin(self, batch: dict) -> torch.Tensor | None:
        if not self.cfg.reward.use_margin:
            return None
        m = batch["margin"]
        return torch.nan_to_num(m, nan=0.0)

    @torch.no_grad()
    def macro_end(self, batch: dict, responses: PairResponses, generator: torch.Generator | None):
        """(2B, A) bool ends of the segments of every row; the reference model runs only for a rule
        that reads its log-probs or entropies."""

        @functools.cache
        def reference() -> tuple[torch.Tensor, torch.Tensor | None]:
            logits = self.ref(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                use_cache=False,
            ).logits
            return response_logprobs_and_entropy(
                logits,
                batch["input_ids"],
                responses.response_start,
                responses.response_ids.shape[1],
                with_entropy="ref_entropy" in self.rule.needs,
            )

        inputs = termination_inputs(
            self.rule,
            responses.response_ids,
            responses.action_mask,
            responses.ends_with_eos,
            ref_logprobs=lambda: reference()[0],
            ref_entropy=lambda: reference()[1],
            generator=generator,
        )
        return self.rule(inputs).macro_end

    def scores(self, engine, batch: dict, generator: torch.Generator | None = None):
        """``(scores (2B,), end scores (2B,), segment mask (2B, M) | None)`` of a device batch
        (its rows packed with ``--packing``, where the model packs exactly)."""
        values = padded_values(
            engine, batch["input_ids"], batch["attention_mask"], packing=self.cfg.batching.packing
        )
        if not self.segment:
            s = end_scores(values, batch["attention_mask"])
            return s, s, None
        responses = pair_responses(
            batch["input_ids"],
            batch["attention_mask"],
            batch["prompt_len"],
            self.pad_id,
            self.eot_id,
        )
        macro_end = self.macro_end(batch, responses, generator)
        s, seg_mask = response_scores(values, batch["attention_mask"], responses, macro_end)
        return s, end_scores(values, batch["attention_mask"]).detach(), seg_mask
