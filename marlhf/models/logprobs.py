"""Token log-probabilities and entropies from language-model logits, without a float32 copy of the logits.

A policy's logits are `(B, T, V)` with V around 256k for Gemma: in bf16 a batch of 8 × 1024 tokens is already
4 GiB, and `torch.log_softmax(logits.float(), -1)` would add 8 GiB more (plus the same again kept by autograd
for the backward pass). Both functions here work on blocks of at most `chunk_elements` logits at a time,
upcast only the block to float32, and keep for the backward pass nothing but the original logits (a
reference, not a copy) and one float32 number per token (the log-normaliser `logsumexp`). Their backward
passes rebuild the softmax block by block and return the gradient in the logits' own dtype, so peak extra
memory is one float32 block whether or not gradients are needed.

Temperature: callers divide the logits by the sampling temperature *before* calling. PPO's importance
ratio pi_theta(a|s) / pi_old(a|s) must be taken between the distributions the actions were actually sampled
from; the rollout log-probs, the training log-probs and the reference log-probs of the KL penalty must all
use the same tempered distribution, or the ratio is not 1 at the start of an update and the KL term
measures the wrong thing.

Usage:

>>> import torch
>>> logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])  # (B=1, T=2, V=2)
>>> labels = torch.tensor([[1, 0]])  # (B, T)
>>> token_logprobs(logits, labels)  # log(1/2), log(e^2 / (e^2 + 1))
tensor([[-0.6931, -0.1269]])
>>> entropy_from_logits(logits)  # log 2 for the uniform row
tensor([[0.6931, 0.3653]])
"""

from __future__ import annotations

import torch

# 2**25 logits per block: 128 MiB of float32 scratch; a handful of tokens per block at V = 256k.
DEFAULT_CHUNK_ELEMENTS = 2**25


def _blocks(batch: int, length: int, vocab: int, chunk_elements: int):
    """Yield `(b0, b1, t0, t1)` index blocks covering a `(batch, length)` grid, each with at most
    `chunk_elements` logits (at least one token per block). Blocks are views: slicing `(B, T, V)` along B
    and T never copies, even when the logits tensor is itself a slice of a longer sequence."""
    t_step = max(1, min(length, chunk_elements // max(1, vocab)))
    b_step = max(1, min(batch, chunk_elements // max(1, t_step * vocab)))
    for b0 in range(0, batch, b_step):
        for t0 in range(0, length, t_step):
            yield b0, min(batch, b0 + b_step), t0, min(length, t0 + t_step)


def _scaled(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """x / temperature (x itself at temperature 1: no copy)."""
    return x if temperature == 1.0 else x / temperature


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    """Computation dtype: float32 for half types and float32, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits)[label] with a blockwise forward and backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits, labels, chunk_elements, temperature):  # noqa: D401 - autograd hook
        B, T, V = logits.shape
        cdtype = _float_dtype(logits.dtype)
        lse = torch.empty(B, T, dtype=cdtype, device=logits.device)
        for b0, b1, t0, t1 in _blocks(B, T, V, chunk_elements):
            x = _scaled(logits[b0:b1, t0:t1].to(cdtype), temperature)
            lse[b0:b1, t0:t1] = torch.logsumexp(x, dim=-1)
        picked = _scaled(
            logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).to(cdtype), temperature
        )
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_elements, ctx.temperature = chunk_elements, temperature
        return picked - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        # d/dx_v [x_y - lse(x)] = 1[v = y] - softmax(x)_v, scaled by the incoming gradient (and
        # by 1 / temperature for x = logits / temperature).
        logits, labels, lse = ctx.saved_tensors
        B, T, V = logits.shape
        temp = ctx.temperature
        grad = torch.empty_like(logits)
        for b0, b1, t0, t1 in _blocks(B, T, V, ctx.chunk_elements):
            g = _scaled(grad_out[b0:b1, t0:t1].unsqueeze(-1).to(lse.dtype), temp)  # (b, t, 1)
            x = _scaled(logits[b0:b1, t0:t1].to(lse.dtype), temp)
            probs = torch.exp(x - lse[b0:b1, t0:t1].unsqueeze(-1))
            block = -g * probs
            block.scatter_add_(-1, labels[b0:b1, t0:t1].unsqueeze(-1), g)
            grad[b0:b1, t0:t1] = block.to(logits.dtype)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """H(softmax(logits)) with a blockwise forward and backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits, chunk_elements, temperature):
        B, T, V = logits.shape
        cdtype = _float_dtype(logits.dtype)
        lse = torch.empty(B, T, dtype=cdtype, device=logits.device)
        ent = torch.empty(B, T, dtype=cdtype, device=logits.device)
        for b0, b1, t0, t1 in _blocks(B, T, V, chunk_elements):
            x = _scaled(logits[b0:b1, t0:t1].to(cdtype), temperature)
            block_lse = torch.logsumexp(x, dim=-1)
            probs = torch.exp(x - block_lse.unsqueeze(-1))
            # H = -sum_v p_v log p_v = lse - sum_v p_v x_v
            ent[b0:b1, t0:t1] = block_lse - (probs * x).sum(-1)
            lse[b0:b1, t0:t1] = block_lse
        ctx.save_for_backward(logits, lse)
        ctx.chunk_elements, ctx.temperature = chunk_elements, temperature
        return ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        # dH/dx_v = -p_v (x_v - E_p[x]) (times 1 / temperature for x = logits / temperature).
        logits, lse = ctx.saved_tensors
        B, T, V = logits.shape
        temp = ctx.temperature
        grad = torch.empty_like(logits)
        for b0, b1, t0, t1 in _blocks(B, T, V, ctx.chunk_elements):
            x = _scaled(logits[b0:b1, t0:t1].to(lse.dtype), temp)
            probs = torch.exp(x - lse[b0:b1, t0:t1].unsqueeze(-1))
            mean_x = (probs * x).sum(-1, keepdim=True)
            g = _scaled(grad_out[b0:b1, t0:t1].unsqueeze(-1).to(lse.dtype), temp)
            grad[b0:b1, t0:t1] = (-g * probs * (x - mean_x)).to(logits.dtype)
        return grad, None, None


def _check_logits(logits: torch.Tensor, name: str = "logits") -> None:
    if logits.dim() != 3:
        raise ValueError(f"{name} must be (B, T, V), got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {logits.dtype}")


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probability of each label under the softmax of its logits.

    Args:
        logits: `(B, T, V)` float (bf16, fp16, fp32 or fp64); may be a non-contiguous slice.
        labels: `(B, T)` long, every entry in `[0, V)` (mask padding afterwards, not with -100).
        chunk_elements: largest number of logits upcast to float32 at once (memory knob only; the
            result does not depend on it beyond float rounding).
        temperature: the log-probabilities are those of `softmax(logits / temperature)`, divided
            block by block in float32 (no tempered copy of the logits is made).

    Returns:
        `(B, T)` float32 (float64 for float64 logits):
        `log_softmax(logits / temperature)[b, t, labels[b, t]]`.
        Differentiable with respect to `logits`; the gradient has the logits' dtype.
    """
    _check_logits(logits)
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must be (B, T) = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}"
        )
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _TokenLogprobs.apply(logits, labels.long(), chunk_elements, float(temperature))


def entropy_from_logits(
    logits: torch.Tensor,
    *,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Entropy (nats) of the softmax distribution at every position.

    Args:
        logits: `(B, T, V)` float; may be a non-contiguous slice.
        chunk_elements: largest number of logits upcast to float32 at once.
        temperature: the entropy of `softmax(logits / temperature)` (divided block by block).

    Returns:
        `(B, T)` float32 (float64 for float64 logits), `-sum_v p_v log p_v`. Differentiable.
    """
    _check_logits(logits)
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _Entropy.apply(logits, chunk_elements, float(temperature))


def response_logprobs(
    logits_full: torch.Tensor,
    sequences: torch.Tensor,
    prompt_len: int,
    *,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Log-probabilities of the response tokens of `prompt + response` sequences.

    The sequences are left-padded prompts of length `P = prompt_len` followed by (right-padded)
    responses, `A = T - P` tokens. A causal LM's logit at position `t` predicts the token at `t + 1`, so
    the response tokens `sequences[:, P:T]` are scored by `logits_full[:, P-1:T-1]`.

    Worked example, P = 3, T = 5 (A = 2)::

        position t        0    1    2    3    4
        sequences[b, t]   pad  p1   p2   r1   r2
        logits[b, t]      ->p1 ->p2 ->r1 ->r2 (unused)

        response_logprobs[b, 0] = log p(r1 | pad p1 p2)  from logits[b, 2]
        response_logprobs[b, 1] = log p(r2 | ... r1)      from logits[b, 3]

    Padding after a response's EOS gets a (meaningless) log-prob too; mask it with `action_mask`.
    Divide the logits by the sampling temperature before calling (see the module docstring).

    Args:
        logits_full: `(B, T, V)` float, the model's output on `sequences`.
        sequences: `(B, T)` long.
        prompt_len: P, with `1 <= P < T`.

    Returns:
        `(B, A)` float32 log-probs, `A = T - P`.

    >>> import torch
    >>> seq = torch.tensor([[0, 1, 1, 0, 1]])  # P = 3 prompt tokens, then response [0, 1]
    >>> logits = torch.zeros(1, 5, 2)
    >>> logits[0, 2, 0] = 10.0  # position 2 predicts position 3 (token 0): nearly certain
    >>> response_logprobs(logits, seq, prompt_len=3).round(decimals=4)  # position 3 is uniform
    tensor([[-0.0000, -0.6931]])
    """
    _check_logits(logits_full, "logits_full")
    B, T, _ = logits_full.shape
    if sequences.shape != (B, T):
        raise ValueError(
            f"sequences must be (B, T) = {(B, T)} like logits_full, got {tuple(sequences.shape)}"
        )
    if not 1 <= prompt_len < T:
        raise ValueError(f"prompt_len must satisfy 1 <= prompt_len < T = {T}, got {prompt_len}")
    return token_logprobs(
        logits_full[:, prompt_len - 1 : T - 1],
        sequences[:, prompt_len:],
        chunk_elements=chunk_elements,
    )
