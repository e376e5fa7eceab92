"""marlhf.macro.credit: the boundary token of every macro action, against a per-row loop."""

import doctest

import pytest
import torch

import marlhf.macro.credit as credit_module
from marlhf.macro.config import MacroConfig
from marlhf.macro.credit import boundary_position, boundary_tokens, credit_mask
from marlhf.macro.segments import build_segments


def random_segments(seed: int, B: int = 8, A: int = 25):
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(0, A + 1, (B,), generator=g)
    n_valid[:3] = torch.tensor([A, 0, 1])
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    ends = (torch.rand(B, A, generator=g) < 0.3) & mask
    ends |= mask & (torch.arange(A)[None, :] == (n_valid - 1)[:, None])
    return build_segments(ends, mask), ends, mask


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "rule, cut, where",
    [
        ("fixed", "after", "first"),
        ("randomized", "after", "first"),
        ("parsing", "after", "first"),
        ("entropy", "after", "first"),
        ("ppl", "after", "first"),
        ("lowprob", "after", "last"),
        ("lowprob", "before", "first"),
    ],
)
def test_boundary_token_per_rule_matches_loop(seed, rule, cut, where):
    seg, ends, mask = random_segments(seed)
    macro = MacroConfig(termination_condition=rule, lowprob_cut=cut)
    assert boundary_position(macro) == where
    got = boundary_tokens(seg, macro)
    B, A = mask.shape
    for b in range(B):
        L = int(mask[b].sum())
        e = [t for t in range(L) if ends[b, t]]
        starts = [0] + [t + 1 for t in e[:-1]]
        marked = set(e) if where == "last" else set(starts)
        if L == 0:
            marked = set()
        assert got[b].tolist() == [t in marked for t in range(A)], f"row {b}"
    # one boundary token per macro action
    assert torch.equal(got.sum(1), seg.count)


def test_credit_mask_all_is_every_token_and_unknown_mode_is_an_error():
    seg, _, mask = random_segments(0)
    assert torch.equal(credit_mask(seg, MacroConfig()), mask)
    boundary = MacroConfig(macro_credit="boundary")
    assert torch.equal(credit_mask(seg, boundary), boundary_tokens(seg, MacroConfig()))
    with pytest.raises(ValueError, match="--macro_credit"):
        credit_mask(seg, MacroConfig(macro_credit="first"))


def test_doctests():
    assert doctest.testmod(credit_module).failed == 0
