"""The one record every dataset adapter produces, and the error bad rows raise."""

from __future__ import annotations

from dataclasses import dataclass, field


class DataError(ValueError):
    """A malformed dataset row; the message names the file, the row and the field, e.g.
    ``data/train.jsonl line 17: field "chosen" missing``."""


@dataclass
class Example:
    """One prompt with an optional preference pair.

    ``prompt`` is already in the dataset's template (it ends where the response starts);
    ``chosen``/``rejected`` are the responses (``rejected`` is None for SFT-only data such as APPS,
    ``chosen`` None for prompt-only data); ``margin`` an optional preference strength;
    ``prompt_id`` a stable id ("dataset/row-id" or "dataset/sha1(prompt)[:16]"); ``meta`` extra
    fields needed later (``subreddit``; for APPS ``tests``, the input_output JSON, and ``fn_name``).
    """

    prompt: str
    chosen: str | None
    rejected: str | None
    margin: float | None
    prompt_id: str
    meta: dict = field(default_factory=dict)
