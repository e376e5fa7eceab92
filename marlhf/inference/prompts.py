"""Prompt selection (by a seeded hash of the prompt id, independent of batch size and file order) and
prompt encoding (``bos + prompt`` cut from the left, left-padded)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from marlhf.data.tokenize import bos_prefix


def selection_key(prompt_id: str, seed: int) -> str:
    """``sha256(f"{seed}:{prompt_id}")`` hex digest: the order prompts are selected in."""
    return hashlib.sha256(f"{seed}:{prompt_id}".encode()).hexdigest()


def select_prompts(examples: Sequence[Any], num_samples: int, seed: int) -> list[Any]:
    """De-duplicate by ``prompt_id`` (first occurrence kept) and keep the ``num_samples`` (0: all)
    with the smallest ``sha256(f"{seed}:{prompt_id}")``, in that order.

    >>> from types import SimpleNamespace as E
    >>> exs = [E(prompt_id=f"p{i}") for i in range(10)] + [E(prompt_id="p3")]
    >>> a = [e.prompt_id for e in select_prompts(exs, 4, seed=1)]
    >>> b = [e.prompt_id for e in select_prompts(list(reversed(exs)), 4, seed=1)]
    >>> a == b, len(set(a)), [e.prompt_id for e in select_prompts(exs, 2, seed=1)] == a[:2]
    (True, 4, True)
    """
    first: dict[str, Any] = {}
    for e in examples:
        first.setdefault(e.prompt_id, e)
    ranked = sorted(first.values(), key=lambda e: selection_key(e.prompt_id, seed))
    return ranked[:num_samples] if num_samples else ranked


def batch_seed(seed: int, first_prompt_id: str) -> int:
    """Sampling seed of a batch."""
    # Sampling noise of a batch depends on the seed and the batch's first prompt, so a resumed run
    # draws the same as an uninterrupted one with the same batch size.
    return int(selection_key(first_prompt_id, seed)[:15], 16)


def row_seeds(seed: int, prompt_ids: Sequence[str], n: int = 1) -> torch.Tensor:
    """(len(prompt_ids) * n,) long: the seed of each sample of each prompt (its ``n`` samples
    consecutive), ``sha256(f"{seed}:{prompt_id}:{k}")`` cut to 60 bits, for a backend that seeds
    rows: a prompt's samples depend on the seed and the prompt only, not on its batch.

    >>> a = row_seeds(1, ["p0", "p1"], n=2)
    >>> a.shape, bool((a[2:] == row_seeds(1, ["p1"], n=2)).all()), len(set(a.tolist()))
    (torch.Size([4]), True, 4)
    """
    return torch.tensor(
        [int(selection_key(f"{p}:{k}", seed)[:15], 16) for p in prompt_ids for k in range(n)],
        dtype=torch.long,
    )


def prompt_token_ids(
    tokenizer: Any, prompts: Sequence[str], max_len: int
) -> tuple[list[list[int]], int]:
    """bos + prompt ids cut from the left to ``max_len`` tokens; and how many were cut."""
    bos = bos_prefix(tokenizer)
    budget = max_len - len(bos)
    if budget < 1:
        raise ValueError(f"--max_prompt_seq_len must exceed {len(bos)}, got {max_len}")
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    cut = sum(len(p) > budget for p in ids)
    return [bos + p[len(p) - budget :] if len(p) > budget else bos + p for p in ids], cut


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, P) long, mask (B, P) bool), padded on the left.

    >>> ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    >>> ids.tolist(), mask.int().tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), P, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            ids[b, P - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[b, P - len(s) :] = True
    return ids, mask
