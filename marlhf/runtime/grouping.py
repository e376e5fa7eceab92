"""How a batch is split into passes by length (``--length_groups``, ``--length_group_call_tokens``):
the setting alone, without torch, so that the configuration imports without it; the grouping itself
is :mod:`marlhf.runtime.length_groups`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grouping:
    """How a batch is split: at most ``max_groups`` passes, each pass's fixed cost counted as
    ``call_tokens`` padded positions (:func:`length_groups`)."""

    max_groups: int = 1
    call_tokens: float = 0.0
