"""How a batch is split into passes by length (``--length_groups``, ``--length_group_call_tokens``):
the setting alone, without torch, so that the configuration imports without it; the grouping itself
is :mod:`marlhf.runtime.length_groups`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grouping:
    """How a batch's rows go through a model: padded, in at most ``max_groups`` passes, each
    pass's fixed cost counted as ``call_tokens`` padded positions
    (:func:`marlhf.runtime.length_groups.length_groups`); with ``packing``, each pass packed
    (:mod:`marlhf.models.packing`, where the model supports it exactly); and with ``max_tokens`` > 0,
    the passes without gradients cut by that token budget (:mod:`marlhf.runtime.micro_batches`)."""

    max_groups: int = 1
    call_tokens: float = 0.0
    packing: bool = False
    max_tokens: int = 0
