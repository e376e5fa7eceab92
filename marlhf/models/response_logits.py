"""The language-model head at the response positions only.

A causal LM computes ``logits = head(hidden)`` at every position, ``(B, T, V)``, but PPO reads the
logits of the A positions that predict response tokens (a rollout is a prompt of up to
``--max_prompt_seq_len`` tokens, then the response). :func:`logits_at` puts a forward pre-hook on
the model's output embedding that gathers the hidden states of those positions first, so the head
(and any post-processing the model applies to its output, e.g. logit soft-capping) runs on
``(B, A, H)`` and the model returns ``(B, A, V)``: per row its own positions, which a shared
``logits_to_keep`` cannot express for flush-left rows whose prompts differ in length. The head's
cost, the logits' memory and the log-softmax over them shrink by the prompt's share of the sequence,
in the forward and in the backward pass (the gather's gradient scatters back into ``(B, T, H)``).

Each kept logit is the head applied to the same hidden state as on the full path: equal to its
logit up to float rounding (matrix products over fewer rows may round differently).

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> torch.manual_seed(0) and None
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32,
...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
>>> ids = torch.randint(0, 40, (2, 7))
>>> pos = torch.tensor([[2, 3, 4], [4, 5, 5]])  # (B, A) per-row positions
>>> with logits_at(model, pos):
...     kept = model(input_ids=ids).logits
>>> full = model(input_ids=ids).logits
>>> kept.shape, torch.allclose(kept, full.gather(1, pos[..., None].expand(2, 3, 40)), atol=1e-6)
(torch.Size([2, 3, 40]), True)
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def output_embedding(model) -> torch.nn.Module | None:
    """The module that maps hidden states to logits (the LM head), or None if the model has none."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


@contextmanager
def logits_at(model, positions: torch.Tensor, *, flat: bool = False):
    """Inside the block, ``model``'s LM head sees only the hidden states at ``positions``.

    positions: (B, A) long, each in [0, T) for the sequences of the next forward call; that call
    then returns logits (B, A, V) whose ``[b, j]`` is the full logit at ``positions[b, j]``. Yields
    whether the hook is in place (False for a model without a findable head: its forward returns
    the full (B, T, V) logits as usual). Hidden states whose shape does not fit ``positions`` (a
    different batch) pass through untouched. ``flat``: ``positions`` index the forward call's
    positions flattened, ``K × T`` for a (K, T) batch (packed rows,
    :meth:`marlhf.models.packing.PackedRows.take`), whatever K is."""
    head = output_embedding(model)
    if head is None:
        yield False
        return

    def gather(_module, args):
        hidden = args[0]
        if flat and hidden.dim() == 3:
            return (hidden.flatten(0, 1)[positions.to(hidden.device)], *args[1:])
        if hidden.dim() != 3 or hidden.shape[0] != positions.shape[0]:
            return None
        idx = positions.to(hidden.device).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return (torch.gather(hidden, 1, idx), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield True
    finally:
        handle.remove()
