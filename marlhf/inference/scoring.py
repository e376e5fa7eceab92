"""Reward-model scores: of a rollout packed as PPO packs it (:func:`score_rollout`), and of texts
re-tokenised for an RM with its own vocabulary (:class:`TextScorer`, also used by
``benchmarks/synthetic_eval.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from marlhf.data.tokenize import bos_prefix, fit
from marlhf.models.sequences import end_index, pack_flush_left


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, T) long, mask (B, T) bool), padded on the right."""
    T = max(max(len(s) for s in seqs), 1)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            ids[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[b, : len(s)] = True
    return ids, mask


@torch.no_grad()
def end_rewards(
    reward_model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """RM value at the last valid token: sequences, attention_mask (B, T) -> (B,) float32."""
    values = reward_model(sequences, attention_mask.long())  # (B, T)
    idx = end_index(attention_mask).to(values.device)
    return values.gather(1, idx.unsqueeze(1)).squeeze(1).float()


@torch.no_grad()
def score_rollout(
    reward_model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    action_mask: torch.Tensor,
    pad_id: int,
) -> torch.Tensor:
    """Score as PPO does: pack flush-left, RM value at the last valid token.

    prompt_ids, prompt_mask: (B, P) left-padded; response_ids, action_mask: (B, A) right-padded.
    Returns (B,) float32.
    """
    seq, mask, _ = pack_flush_left(prompt_ids, prompt_mask, response_ids, action_mask, pad_id)
    device = next(reward_model.parameters()).device
    return end_rewards(reward_model, seq.to(device), mask.to(device)).cpu()


class TextScorer:
    """Scores (prompt, response) texts with an RM: ``bos + prompt + response [+ eos]`` (prompt and
    response tokenised separately, as the RM stage builds its pairs), cut to ``budget`` tokens with
    :func:`marlhf.data.tokenize.fit`, batched right-padded."""

    def __init__(
        self, reward_model: torch.nn.Module, tokenizer: Any, eot: list[int], budget: int
    ) -> None:
        self.rm, self.tok, self.eot = reward_model, tokenizer, eot
        self.bos = bos_prefix(tokenizer)
        self.budget = budget - len(self.bos)

    def encode(
        self, prompts: Sequence[str], responses: Sequence[str], add_eot: Sequence[bool]
    ) -> list[list[int]]:
        p_ids = self.tok(list(prompts), add_special_tokens=False)["input_ids"]
        r_ids = self.tok(list(responses), add_special_tokens=False)["input_ids"]
        out = []
        for p, r, e in zip(p_ids, r_ids, add_eot, strict=True):
            p, (r,) = fit(p, [r + (self.eot if e else [])], self.budget)
            out.append(self.bos + p + r)
        return out

    @torch.no_grad()
    def __call__(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        add_eot: Sequence[bool] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """(rewards (B,) float32, response token counts (B,) after truncation)."""
        add_eot = [True] * len(prompts) if add_eot is None else add_eot
        seqs = self.encode(prompts, responses, add_eot)
        ids, mask = right_pad(seqs, self.tok.pad_token_id)
        device = next(self.rm.parameters()).device
        n_prompt = [
            len(s) for s in self.encode(prompts, [""] * len(prompts), [False] * len(prompts))
        ]
        counts = [len(s) - n for s, n in zip(seqs, n_prompt, strict=True)]
        return end_rewards(self.rm, ids.to(device), mask.to(device)).cpu(), counts
