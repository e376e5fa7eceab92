"""Tests for marlhf.models.logprobs against torch.log_softmax references, per-token loops and hand examples."""

import doctest
import math

import pytest
import torch

import marlhf.models.logprobs as lp_mod
from marlhf.models.logprobs import entropy_from_logits, response_logprobs, token_logprobs


def _reference_token_logprobs(logits, labels):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [1, 13, 2**25])
def test_token_logprobs_matches_log_softmax_gather(dtype, chunk_elements):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 7, 11, generator=g)).to(dtype)
    labels = torch.randint(0, 11, (3, 7), generator=g)
    out = token_logprobs(logits, labels, chunk_elements=chunk_elements)
    assert out.dtype == torch.float32 and out.shape == (3, 7)
    # Both upcast the same bf16 values to float32, so they agree to float32 rounding.
    torch.testing.assert_close(out, _reference_token_logprobs(logits, labels), rtol=1e-6, atol=1e-6)


def test_token_logprobs_hand_example():
    logits = torch.tensor([[[math.log(1.0), math.log(3.0)], [0.0, 0.0]]])
    out = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75), math.log(0.5)]]))


def test_token_logprobs_float64_stays_float64_and_gradcheck():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 7, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5), generator=g)
    assert token_logprobs(x, labels).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda t: token_logprobs(t, labels, chunk_elements=10), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_gradient_matches_autograd_reference(dtype):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(2, 6, 9, generator=g).to(dtype)
    labels = torch.randint(0, 9, (2, 6), generator=g)
    weights = torch.randn(2, 6, generator=g)

    x = base.clone().requires_grad_(True)
    (token_logprobs(x, labels, chunk_elements=20) * weights).sum().backward()
    ref = base.clone().requires_grad_(True)
    (_reference_token_logprobs(ref, labels) * weights).sum().backward()
    assert x.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(x.grad.float(), ref.grad.float(), rtol=tol, atol=tol)


def test_token_logprobs_non_contiguous_slice():
    g = torch.Generator().manual_seed(3)
    full = torch.randn(2, 8, 5, generator=g)
    labels = torch.randint(0, 5, (2, 4), generator=g)
    view = full[:, 2:6]
    assert not view.is_contiguous()
    torch.testing.assert_close(
        token_logprobs(view, labels, chunk_elements=7), _reference_token_logprobs(view, labels)
    )


def test_no_full_float32_copy_saved_for_backward():
    """Invariant: autograd keeps the bf16 logits themselves, nothing of size B*T*V in float32."""
    B, T, V = 2, 4, 64
    logits = torch.randn(B, T, V).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, V, (B, T))
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = token_logprobs(logits, labels, chunk_elements=V) + entropy_from_logits(
            logits, chunk_elements=V
        )
    assert saved, "expected the custom functions to save tensors"
    assert all(not (dt == torch.float32 and n >= B * T * V) for dt, n in saved), saved
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def _reference_entropy_loop(logits):
    B, T, _ = logits.shape
    out = torch.empty(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            probs = torch.softmax(logits[b, t].double(), dim=-1).tolist()
            out[b, t] = -sum(p * math.log(p) for p in probs if p > 0)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_matches_loop(dtype):
    g = torch.Generator().manual_seed(4)
    logits = (2 * torch.randn(3, 5, 13, generator=g)).to(dtype)
    out = entropy_from_logits(logits, chunk_elements=26)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference_entropy_loop(logits), rtol=1e-5, atol=1e-5)


def test_entropy_hand_values_and_gradcheck():
    logits = torch.zeros(1, 2, 4)
    logits[0, 1, 2] = 1000.0  # a point mass
    out = entropy_from_logits(logits)
    torch.testing.assert_close(out, torch.tensor([[math.log(4.0), 0.0]]))
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: entropy_from_logits(t, chunk_elements=7), (x,))


def test_response_logprobs_matches_loop_over_positions():
    g = torch.Generator().manual_seed(5)
    B, P, A, V = 3, 4, 5, 10
    T = P + A
    logits = torch.randn(B, T, V, generator=g)
    seq = torch.randint(0, V, (B, T), generator=g)
    out = response_logprobs(logits, seq, prompt_len=P, chunk_elements=11)
    assert out.shape == (B, A)
    for b in range(B):
        for j in range(A):
            # token at absolute position P + j is predicted by the logit at P + j - 1
            expected = torch.log_softmax(logits[b, P + j - 1], dim=-1)[seq[b, P + j]]
            torch.testing.assert_close(out[b, j], expected)


def test_response_logprobs_hand_example():
    # P = 2: sequence [pad, p, r1, r2]; logits[1] must score r1 and logits[2] score r2.
    seq = torch.tensor([[0, 1, 2, 0]])
    logits = torch.zeros(1, 4, 3)
    logits[0, 1] = torch.tensor([0.0, 0.0, math.log(2.0)])  # p(r1=2) = 2/4
    logits[0, 2] = torch.tensor([math.log(3.0), 0.0, 0.0])  # p(r2=0) = 3/5
    logits[0, 3] = 100.0 * torch.tensor([1.0, -1.0, -1.0])  # last position: must not be used
    torch.testing.assert_close(
        response_logprobs(logits, seq, 2), torch.tensor([[math.log(0.5), math.log(0.6)]])
    )


def test_validation_errors():
    with pytest.raises(ValueError, match="prompt_len"):
        response_logprobs(torch.zeros(1, 3, 2), torch.zeros(1, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="prompt_len"):
        response_logprobs(torch.zeros(1, 3, 2), torch.zeros(1, 3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="sequences"):
        response_logprobs(torch.zeros(1, 3, 2), torch.zeros(1, 4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="labels"):
        token_logprobs(torch.zeros(1, 3, 2), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.zeros(3, 2))


def test_docstring_examples():
    assert doctest.testmod(lp_mod).failed == 0
