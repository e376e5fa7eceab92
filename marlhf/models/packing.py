"""Packed sequences: the rows of a padded batch laid end to end, so a forward pass computes their
tokens and not their padding.

A padded batch ``(B, T)`` costs ``B × T`` positions whatever its rows hold. :func:`pack_rows` puts
each row's tokens (``attention_mask`` true: left-, right- or un-padded rows alike) into *bins* of
``C`` positions, several rows per bin (first fit, longest rows first), with position ids that
restart at 0 at each row. A model whose attention mask is built from those position ids by
transformers' ``masking_utils`` (``find_packed_sequence_indices``: a new sequence wherever the
position does not grow by 1) then attends within each row only, a block-diagonal causal mask, and
every token's output is the padded computation's up to float rounding. Requirements: no 2-D
attention mask and no cache in the call (``use_cache=False``: with a cache transformers ignores the
packing), the position ids passed explicitly, a model type of :data:`PACKED_MODEL_TYPES` (checked
by :func:`packing_mode`; other models run padded).

Layouts (:func:`packing_mode`):

- ``bins`` (``sdpa``, ``eager``): bins of ``C = max row length`` positions, the rows of a bin
  followed by padding that continues the last row's positions (it never precedes a real token, so
  nothing attends to it). The attention of a bin costs ``C²`` at most, as a padded row does, and a
  batch whose rows all have one length packs into one row per bin: the padded batch itself, with
  plain causal attention.
- ``varlen`` (``flash_attention_*``, a CUDA path): one bin of all the tokens, no padding, and the
  cumulative sequence lengths passed as ``cu_seq_lens_q/k`` and ``max_length_q/k`` (transformers'
  ``FlashAttentionKwargs``), so the flash-attention varlen kernel runs each row on its own.

Each input token's place in the packed batch is ``index: (B, T)`` (flat, into ``K × C``; -1 on
padding): :meth:`PackedRows.take` reads packed outputs at any positions of the input layout and
:meth:`PackedRows.unpack` puts them back into it.

>>> ids = torch.tensor([[5, 6, 7], [8, 9, 0], [4, 0, 0]])
>>> p = pack_rows(ids, ids != 0)
>>> p.input_ids.tolist(), p.position_ids.tolist()
([[5, 6, 7], [8, 9, 4]], [[0, 1, 2], [0, 1, 0]])
>>> p.index.tolist()
[[0, 1, 2], [3, 4, -1], [5, -1, -1]]
>>> p.unpack(p.input_ids, fill=0).tolist()
[[5, 6, 7], [8, 9, 0], [4, 0, 0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Model types whose attention masks come from ``masking_utils`` with the position ids (so packed
# rows never see each other) and whose positions are read from ``position_ids``; each is checked
# against its padded forward in tests/models/test_packing.py.
PACKED_MODEL_TYPES = ("gemma", "gemma2", "llama", "mistral", "qwen2", "qwen3", "gpt2")
# attention implementations that build their masks from packed position ids
_BIN_ATTENTION = ("sdpa", "eager")


def _config(model):
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        return config, config.get_text_config()
    return config, config


def packing_mode(model) -> str | None:
    """How ``model`` (a causal LM, a :class:`marlhf.models.reward_model.RewardModel`, either
    wrapped by peft, or a DeepSpeed engine of one) runs packed rows exactly: ``"bins"``,
    ``"varlen"`` or None (run it padded): see the module docstring."""
    module = getattr(model, "module", None)
    config, text = _config(module if isinstance(module, torch.nn.Module) else model)
    if config is None or getattr(text, "model_type", None) not in PACKED_MODEL_TYPES:
        return None
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl in _BIN_ATTENTION:
        return "bins"
    if "flash" in impl:
        return "varlen"
    return None


def packs(attention_mask: torch.Tensor, layout: str | None) -> bool:
    """Whether packing a batch (``attention_mask``: (B, T)) in ``layout`` changes its computation:
    always for ``varlen`` (no padding at all), for ``bins`` only where two rows fit in one bin of
    the longest row's width (else every bin holds one row: the padded batch itself, which then
    runs padded, without the packing's bookkeeping); never for None."""
    if layout is None:
        return False
    if layout == "varlen":
        return True
    lengths = attention_mask.sum(1)
    if lengths.shape[0] < 2:
        return False
    two = torch.topk(lengths, 2, largest=False).values
    return int(two.sum()) <= int(lengths.max())


def attention_weight(model) -> float:
    """A model's attention cost per position of context, over its other cost per token (the
    matrix products of a layer): ``2 · heads · head_dim / P_layer``, with ``P_layer`` the
    parameters of one layer's projections and MLP. A packed bin of width C then costs ``1 +
    attention_weight · C`` per position (:func:`marlhf.runtime.length_groups.packed_cost`): 0.0014
    for tiny-base, 0.00008 for a 1 B Gemma of hidden 2048 (attention matters on narrow models)."""
    module = getattr(model, "module", None)
    _, t = _config(module if isinstance(module, torch.nn.Module) else model)
    hidden = getattr(t, "hidden_size", None) or getattr(t, "n_embd", 0)
    heads = getattr(t, "num_attention_heads", None) or getattr(t, "n_head", 1)
    head_dim = getattr(t, "head_dim", None) or hidden // max(heads, 1)
    kv = getattr(t, "num_key_value_heads", None) or heads
    inner = getattr(t, "intermediate_size", None) or getattr(t, "n_inner", None) or 4 * hidden
    per_layer = 2 * hidden * head_dim * (heads + kv) + 3 * hidden * inner
    return 2.0 * heads * head_dim / max(per_layer, 1)


@dataclass(frozen=True)
class PackedRows:
    """A batch of B rows packed into K bins of C positions (:func:`pack_rows`)."""

    input_ids: torch.Tensor  # (K, C) long  the rows' tokens end to end, padding after
    position_ids: torch.Tensor  # (K, C) long  0, 1, ... within each row
    index: torch.Tensor  # (B, T) long  each input token's flat position in K·C; -1 on padding
    lengths: torch.Tensor  # (B,) long  tokens per row
    # flash-attention varlen arguments (layout "varlen"), else empty
    attention_kwargs: dict

    def take(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x`` (K, C, ...) packed outputs read at ``positions`` (B, A) long of the input layout:
        (B, A, ...). Entries at padding positions are meaningless (callers mask them)."""
        flat = self.index.gather(1, positions.to(self.index.device)).clamp(min=0)
        return x.flatten(0, 1)[flat.to(x.device)]

    def unpack(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``x`` (K, C, ...) -> (B, T, ...) in the input layout, ``fill`` on padding."""
        out = x.flatten(0, 1)[self.index.clamp(min=0).to(x.device)]
        pad = (self.index < 0).to(x.device).view(*self.index.shape, *([1] * (x.dim() - 2)))
        return out.masked_fill(pad, fill)

    def pack(self, x: torch.Tensor, fill: int | float) -> torch.Tensor:
        """A per-token tensor ``x`` (B, T) of the input layout packed like the tokens: (K, C),
        ``fill`` on the bins' padding."""
        K, C = self.input_ids.shape
        out = torch.full((K * C,), fill, dtype=x.dtype, device=x.device)
        valid = self.index >= 0
        out[self.index[valid].to(x.device)] = x[valid.to(x.device)]
        return out.view(K, C)

    def first_tokens(self) -> torch.Tensor:
        """(K, C) bool: true on each row's first token (where a causal LM's label has no
        prediction in the padded layout)."""
        return self.position_ids == 0


def _first_fit(lengths: list[int], capacity: int) -> tuple[list[int], list[int], int]:
    """Bin and offset of each row, first fit over the rows longest first; the number of bins.
    Rows of length 0 take no room (bin 0, offset 0)."""
    order = sorted(range(len(lengths)), key=lambda b: -lengths[b])
    free: list[int] = []
    bins, offsets = [0] * len(lengths), [0] * len(lengths)
    for b in order:
        n = lengths[b]
        if n == 0:
            continue
        k = next((k for k, f in enumerate(free) if f >= n), len(free))
        if k == len(free):
            free.append(capacity)
        bins[b], offsets[b] = k, capacity - free[k]
        free[k] -= n
    return bins, offsets, max(1, len(free))


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    layout: str = "bins",
    pad_id: int = 0,
) -> PackedRows:
    """Pack the tokens of a padded batch (see the module docstring).

    input_ids: (B, T) long; attention_mask: (B, T), true (1) on each row's tokens, which keep
    their order (left, right or no padding). ``layout``: ``"bins"`` (bins of the longest row's
    length) or ``"varlen"`` (one bin of every token, with the flash-attention varlen arguments).
    ``pad_id``: the token on the bins' padding (any id of the vocabulary: nothing attends to it).
    """
    if layout not in ("bins", "varlen"):
        raise ValueError(f"layout must be 'bins' or 'varlen', got {layout!r}")
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"pack_rows: input_ids {tuple(input_ids.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must both be (B, T)"
        )
    device = input_ids.device
    valid = attention_mask.bool()
    lengths = valid.sum(1)
    lens = lengths.tolist()
    total = sum(lens)
    capacity = max(1, total if layout == "varlen" else max(lens, default=0))
    bins, offsets, K = _first_fit(lens, capacity)
    start = torch.tensor(bins, dtype=torch.long) * capacity + torch.tensor(offsets)  # (B,)
    rank_in_row = valid.long().cumsum(1) - 1  # (B, T) k-th token of its row
    index = torch.where(valid, start.to(device).unsqueeze(1) + rank_in_row, -1)
    flat_ids = torch.full((K * capacity,), pad_id, dtype=input_ids.dtype, device=device)
    flat_ids[index[valid]] = input_ids[valid]
    # positions: the distance to the last row start at or before each slot (every bin begins with
    # a row, and its padding continues the bin's last row)
    slot = torch.arange(K * capacity, device=device)
    is_start = torch.zeros(K * capacity, dtype=torch.bool, device=device)
    is_start[start.to(device)[lengths > 0]] = True
    is_start[::capacity] = True
    last_start = torch.cummax(torch.where(is_start, slot, 0), dim=0).values
    kwargs: dict = {}
    if layout == "varlen":
        seq = torch.tensor([lens[b] for b in sorted(range(len(lens)), key=offsets.__getitem__)])
        seq = seq[seq > 0]
        cu = torch.cat([seq.new_zeros(1), seq.cumsum(0)]).to(device=device, dtype=torch.int32)
        longest = int(seq.max()) if len(seq) else 1
        kwargs = dict(
            cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest
        )
    return PackedRows(
        input_ids=flat_ids.view(K, capacity),
        position_ids=(slot - last_start).view(K, capacity),
        index=index,
        lengths=lengths,
        attention_kwargs=kwargs,
    )


def packed_inputs(p: PackedRows) -> dict:
    """The keyword arguments of a forward pass over ``p``: ids, position ids, no attention mask,
    no cache, and the varlen arguments of the ``varlen`` layout."""
    return dict(
        input_ids=p.input_ids,
        position_ids=p.position_ids,
        attention_mask=None,
        use_cache=False,
        **p.attention_kwargs,
    )
