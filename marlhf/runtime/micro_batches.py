"""Micro-batches by a token budget (``--max_tokens_per_micro_batch``) instead of a row count.

A forward and backward pass costs (and holds activations for) the positions it computes: the rows'
tokens when they are packed (:mod:`marlhf.models.packing`), rows × the longest row when padded. With
a budget of N positions, :func:`token_micro_batches` sorts the rows longest first and fills each
micro-batch with the next rows while its cost stays within N (a row longer than N goes alone), so
long rows travel in small micro-batches and short ones in large.

The gradient does not depend on the split: every loss of the stages is a sum over rows divided by
counts taken over the whole batch (tokens, terms or rows of the global minibatch or optimizer step,
``--loss_agg_mode``), so the micro-batches' losses are shares that add up to the whole batch's loss
(tests/algo/test_losses.py, tests/stages/ppo/test_update.py). DeepSpeed then accumulates the
micro-batches' gradients into one optimizer step (:func:`accumulation_boundary`).

Ranks must agree on the number of micro-batches whenever a pass holds a collective (ZeRO-3 gathers
weights in every forward, ZeRO-2 reduces gradients in every backward): :func:`agreed_count` is the
largest count of any rank, and ``token_micro_batches(..., count=n)`` splits into exactly ``n``
micro-batches (halving the micro-batch with most rows until there are ``n``: still within the
budget).

>>> [m.tolist() for m in token_micro_batches(torch.tensor([5, 30, 6, 29, 7]), 40, packed=True)]
[[1], [3, 4], [2, 0]]
>>> [m.tolist() for m in token_micro_batches(torch.tensor([5, 30, 6, 29, 7]), 40, packed=False)]
[[1], [3], [4, 2, 0]]
"""

from __future__ import annotations

import torch

from marlhf.runtime.distributed import device, world_size


def token_micro_batches(
    lengths: torch.Tensor, max_tokens: int, *, packed: bool, count: int | None = None
) -> list[torch.Tensor]:
    """The rows cut into micro-batches of at most ``max_tokens`` positions each (see the module
    docstring): a list of (n_i,) long row indices, longest rows first, their union ``0 … B−1``.

    lengths: (B,) long, each row's tokens. ``packed``: a micro-batch costs the sum of its rows'
    lengths (else rows × its longest row). ``count``: exactly that many micro-batches (1 ≤ count ≤
    B; more than the budget needs splits the largest ones further)."""
    if max_tokens < 1:
        raise ValueError(f"--max_tokens_per_micro_batch must be >= 1 here, got {max_tokens}")
    B = int(lengths.shape[0])
    if count is not None and not 1 <= count <= max(B, 1):
        raise ValueError(f"count must be in [1, {B}], got {count}")
    order = torch.sort(lengths.cpu(), descending=True, stable=True).indices.tolist()
    lens = lengths.cpu().tolist()
    parts: list[list[int]] = []
    cost = 0
    for b in order:
        n = int(lens[b])
        if parts:
            part = parts[-1]
            new = cost + n if packed else (len(part) + 1) * int(lens[part[0]])
            if new <= max_tokens:
                part.append(b)
                cost = new
                continue
        parts.append([b])
        cost = n
    if not parts:
        parts = [[]]
    while count is not None and len(parts) < count:
        k = max(range(len(parts)), key=lambda i: len(parts[i]))
        half = (len(parts[k]) + 1) // 2
        parts[k : k + 1] = [parts[k][:half], parts[k][half:]]
    if count is not None and len(parts) > count:
        raise ValueError(
            f"{len(parts)} micro-batches needed for the budget, more than count={count}"
        )
    return [torch.tensor(p, dtype=torch.long, device=lengths.device) for p in parts]


def agreed_count(n: int) -> int:
    """The largest ``n`` over the ranks (``n`` itself in one process)."""
    if world_size() == 1:
        return n
    t = torch.tensor([n], dtype=torch.long, device=device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


def split_rows(
    lengths: torch.Tensor, max_tokens: int, *, packed: bool, agree: bool
) -> list[torch.Tensor]:
    """:func:`token_micro_batches`, with as many micro-batches on every rank when ``agree`` (the
    passes hold collectives: see the module docstring)."""
    parts = token_micro_batches(lengths, max_tokens, packed=packed)
    if not agree or world_size() == 1:
        return parts
    n = agreed_count(len(parts))
    if n == len(parts):
        return parts
    return token_micro_batches(lengths, max_tokens, packed=packed, count=n)


def accumulation_boundary(engine, is_boundary: bool | None) -> None:
    """Tell a DeepSpeed ``engine`` whether the next backward pass ends an optimizer step (True) or
    accumulates into it (False); None hands the decision back to its own micro-step count
    (``gradient_accumulation_steps``). Set before each micro-batch's backward pass of a step
    split into a number of micro-batches of its own; an engine without the setting is left as
    it is."""
    setter = getattr(engine, "set_gradient_accumulation_boundary", None)
    if setter is None:
        return
    if is_boundary is not None:
        setter(is_boundary)
        return
    # DeepSpeed's setter stores a bool in its optimizer; None restores the engine's own count
    engine._is_gradient_accumulation_boundary = None
    optimizer = getattr(engine, "optimizer", None)
    if hasattr(optimizer, "set_gradient_accumulation_boundary"):
        optimizer.set_gradient_accumulation_boundary(engine.is_gradient_accumulation_boundary())


def regroup(
    micro_batches: list[list[int]], length_of, max_tokens: int, *, packed: bool
) -> list[list[int]]:
    """The rows of one optimizer step's micro-batches (dataset indices, this rank's) cut anew by a
    budget of ``max_tokens`` positions (:func:`split_rows`, as many micro-batches on every rank);
    ``length_of(index)``: a row's tokens. ``max_tokens`` 0: ``micro_batches`` unchanged."""
    if not max_tokens:
        return micro_batches
    rows = [i for batch in micro_batches for i in batch]
    lengths = torch.tensor([int(length_of(i)) for i in rows], dtype=torch.long)
    parts = split_rows(lengths, max_tokens, packed=packed, agree=world_size() > 1)
    return [[rows[j] for j in p.tolist()] for p in parts]


def accumulate(engine, micro_batches: list, explicit: bool):
    """Yield the micro-batches of one optimizer step; with ``explicit`` (micro-batches formed by a
    token budget, their number not DeepSpeed's ``gradient_accumulation_steps``), the engine is
    told before each one whether its backward pass ends the step
    (:func:`accumulation_boundary`), and given its own count back after the last."""
    n = len(micro_batches)
    for k, batch in enumerate(micro_batches):
        if explicit:
            accumulation_boundary(engine, k == n - 1)
        yield batch
    if explicit:
        accumulation_boundary(engine, None)
