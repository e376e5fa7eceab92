"""Token-budget micro-batches: a partition of the rows, each micro-batch within the budget (a row
longer than the budget alone), longest rows first, exactly ``count`` micro-batches when asked."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest
import torch

from marlhf.runtime import micro_batches as mb


def test_doctests():
    assert doctest.testmod(mb).failed == 0


def _cost(lengths, rows, packed):
    ls = [int(lengths[i]) for i in rows]
    return sum(ls) if packed else len(ls) * max(ls)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_a_partition_within_the_budget(seed, packed):
    g = torch.Generator().manual_seed(seed)
    B = 1 + seed * 3
    lengths = torch.randint(1, 60, (B,), generator=g)
    budget = int(torch.randint(20, 150, (1,), generator=g))
    parts = mb.token_micro_batches(lengths, budget, packed=packed)
    rows = [r for p in parts for r in p.tolist()]
    assert sorted(rows) == list(range(B))
    for p in parts:
        assert len(p) >= 1
        assert _cost(lengths, p.tolist(), packed) <= budget or len(p) == 1
    # longest first, and no two neighbours could share a micro-batch (a greedy fill)
    flat = [int(lengths[r]) for r in rows]
    assert flat == sorted(flat, reverse=True)
    for a, b in zip(parts, parts[1:], strict=False):
        assert _cost(lengths, a.tolist() + b.tolist()[:1], packed) > budget
    for count in range(len(parts), B + 1):
        exact = mb.token_micro_batches(lengths, budget, packed=packed, count=count)
        assert len(exact) == count
        assert sorted(r for p in exact for r in p.tolist()) == list(range(B))
        for p in exact:
            assert len(p) >= 1
            assert _cost(lengths, p.tolist(), packed) <= budget or len(p) == 1


def test_bad_budgets_and_counts():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        mb.token_micro_batches(torch.tensor([3]), 0, packed=True)
    with pytest.raises(ValueError, match="count"):
        mb.token_micro_batches(torch.tensor([3, 4]), 10, packed=True, count=3)
    with pytest.raises(ValueError, match="more than count"):
        mb.token_micro_batches(torch.tensor([8, 8, 8]), 10, packed=True, count=2)
    from marlhf.config import BatchingConfig

    with pytest.raises(ValueError, match="--max_tokens_per_micro_batch must be >= 0"):
        BatchingConfig(max_tokens_per_micro_batch=-1)


def test_the_accumulation_boundary_is_set_and_handed_back():
    calls = []
    optimizer = SimpleNamespace(set_gradient_accumulation_boundary=calls.append)
    engine = SimpleNamespace(
        _is_gradient_accumulation_boundary=None,
        optimizer=optimizer,
        set_gradient_accumulation_boundary=lambda b: setattr(
            engine, "_is_gradient_accumulation_boundary", b
        ),
        is_gradient_accumulation_boundary=lambda: (
            engine._is_gradient_accumulation_boundary
            if engine._is_gradient_accumulation_boundary is not None
            else "managed"
        ),
    )
    mb.accumulation_boundary(engine, False)
    assert engine._is_gradient_accumulation_boundary is False
    mb.accumulation_boundary(engine, None)
    assert engine._is_gradient_accumulation_boundary is None and calls == ["managed"]
    mb.accumulation_boundary(object(), True)  # no such setting: nothing to do
