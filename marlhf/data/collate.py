"""Collators: lists of tokenised rows -> padded tensors.

Training batches (SFT, pairs) are right-padded; PPO prompts are left-padded so every generated
response starts at the same column.

>>> SFTCollator(pad_id=0)([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [5], "labels": [-100]}])["labels"]
tensor([[-100,    6,    7],
        [-100, -100, -100]])
>>> PromptCollator(pad_id=0)([{"input_ids": [5, 6], "prompt_id": "a"}, {"input_ids": [7], "prompt_id": "b"}])["input_ids"]
tensor([[5, 6],
        [0, 7]])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


def pad(rows: list[list[int]], value: int, left: bool = False) -> torch.Tensor:
    """``(B, T)`` long tensor of ``rows`` padded with ``value`` on the right (or left)."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):  # one copy per row: collators run in the data loader
        if len(r):
            if left:
                out[i, width - len(r) :] = torch.as_tensor(r, dtype=torch.long)
            else:
                out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def _mask(rows: list[list[int]], left: bool = False) -> torch.Tensor:
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    width = int(lengths.max()) if len(rows) else 0
    pos = torch.arange(width).unsqueeze(0)
    if left:
        return (pos >= width - lengths.unsqueeze(1)).long()
    return (pos < lengths.unsqueeze(1)).long()


@dataclass
class SFTCollator:
    """Right-pads ``input_ids`` (with ``pad_id``), ``attention_mask`` and ``labels`` (with -100).

    Returns ``input_ids: (B, T) long``, ``attention_mask: (B, T) long``, ``labels: (B, T) long``.
    """

    pad_id: int

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        ids = [list(r["input_ids"]) for r in rows]
        return {
            "input_ids": pad(ids, self.pad_id),
            "attention_mask": _mask(ids),
            "labels": pad([list(r["labels"]) for r in rows], IGNORE_INDEX),
        }


@dataclass
class PairCollator:
    """Stacks the B chosen rows, then the B rejected rows, into one right-padded batch of 2B.

    Returns ``input_ids: (2B, T) long``, ``attention_mask: (2B, T) long``, ``margin: (B,) float``
    (nan where the data has none) and ``prompt_len: (B,) long``.
    """

    pad_id: int

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        seqs = [list(r["chosen_input_ids"]) for r in rows] + [
            list(r["rejected_input_ids"]) for r in rows
        ]
        margin = [r.get("margin") for r in rows]
        return {
            "input_ids": pad(seqs, self.pad_id),
            "attention_mask": _mask(seqs),
            "margin": torch.tensor(
                [float("nan") if m is None else float(m) for m in margin], dtype=torch.float32
            ),
            "prompt_len": torch.tensor(
                [int(r.get("prompt_len", 0)) for r in rows], dtype=torch.long
            ),
        }


@dataclass
class PromptCollator:
    """Left-pads prompts: ``input_ids: (B, P) long``, ``attention_mask: (B, P) long``,
    ``prompt_id: list[str]``, and ``prompt``/``meta`` lists when the rows have them."""

    pad_id: int

    def __call__(self, rows: list[dict]) -> dict:
        ids = [list(r["input_ids"]) for r in rows]
        out: dict = {
            "input_ids": pad(ids, self.pad_id, left=True),
            "attention_mask": _mask(ids, left=True),
            "prompt_id": [r["prompt_id"] for r in rows],
        }
        for key in ("prompt", "meta"):
            if rows and key in rows[0]:
                out[key] = [r[key] for r in rows]
        return out
