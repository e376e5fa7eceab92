"""marlhf.macro.segments against per-row Python loops and hand-worked weights."""

import doctest

import pytest
import torch

import marlhf.macro.segments as segments_module
from marlhf.macro.segments import build_segments, macro_weights, to_macro, to_tokens


def random_layout(seed: int, B: int = 7, A: int = 13):
    """Random right-padded mask (lengths include 0, 1 and A) and random macro ends on it."""
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(0, A + 1, (B,), generator=g)
    n_valid[0], n_valid[1], n_valid[2] = A, 1, 0
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    ends = (torch.rand(B, A, generator=g) < 0.4) & mask
    ends |= torch.arange(A)[None, :] == (n_valid - 1)[:, None]
    return ends & mask, mask


def loop_macros(macro_end, mask):
    """Per row: list of macro actions, each a list of token indices."""
    rows = []
    for b in range(mask.shape[0]):
        macros, current = [], []
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                break
            current.append(t)
            if macro_end[b, t]:
                macros.append(current)
                current = []
        assert current == []
        rows.append(macros)
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_build_segments_matches_loop(seed):
    macro_end, mask = random_layout(seed)
    seg = build_segments(macro_end, mask)
    rows = loop_macros(macro_end, mask)
    M = max(1, max(len(r) for r in rows))
    assert seg.mask.shape == (mask.shape[0], M)
    for b, macros in enumerate(rows):
        assert seg.count[b] == len(macros)
        for t in range(mask.shape[1]):
            expected = next((k for k, m in enumerate(macros) if t in m), -1)
            assert seg.ids[b, t] == expected
        for k in range(M):
            if k < len(macros):
                assert seg.mask[b, k]
                assert seg.lengths[b, k] == len(macros[k])
                assert seg.start[b, k] == macros[k][0]
                assert seg.end[b, k] == macros[k][-1]
            else:
                assert not seg.mask[b, k]
                assert seg.lengths[b, k] == 0 and seg.start[b, k] == 0 and seg.end[b, k] == 0
    assert torch.equal(seg.macro_end, macro_end)


def test_build_segments_validates():
    mask = torch.tensor([[True, True, False]])
    with pytest.raises(ValueError, match="last valid token"):
        build_segments(torch.tensor([[True, False, False]]), mask)
    with pytest.raises(ValueError, match="padding"):
        build_segments(torch.tensor([[False, True, True]]), mask)
    with pytest.raises(ValueError, match="right-padded"):
        build_segments(torch.tensor([[True, False, True]]), torch.tensor([[True, False, True]]))
    with pytest.raises(ValueError, match=r"\(B, A\)"):
        build_segments(torch.tensor([True]), torch.tensor([True]))


def test_all_empty_batch_has_one_invalid_macro_column():
    seg = build_segments(torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool))
    assert seg.mask.shape == (2, 1) and not seg.mask.any()
    assert (seg.ids == -1).all()
    assert to_macro(torch.ones(2, 3), seg).tolist() == [[0.0], [0.0]]


@pytest.mark.parametrize("B", [0, 3])
def test_zero_width_batch_gives_empty_segments(B):
    """A = 0 (every response empty) gives empty segments, no error from the last-token check."""
    empty = torch.zeros(B, 0, dtype=torch.bool)
    seg = build_segments(empty, empty)
    assert seg.ids.shape == (B, 0) and seg.count.tolist() == [0] * B
    assert seg.mask.shape == (B, 1) and not seg.mask.any()
    assert seg.macro_end.shape == (B, 0)
    x = torch.zeros(B, 0)
    assert to_macro(x, seg).tolist() == [[0.0]] * B
    assert to_tokens(to_macro(x, seg), seg).shape == (B, 0)
    for name in ("equal", "position", "unit", "start"):
        assert macro_weights(seg, name).shape == (B, 0)


def test_weights_by_hand():
    # One row, 6 tokens: macro actions {0,1,2} and {3,4}; token 5 is padding.
    macro_end = torch.tensor([[0, 0, 1, 0, 1, 0]]).bool()
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]]).bool()
    seg = build_segments(macro_end, mask)
    # equal: 1/3 on the first macro action, 1/2 on the second, 0 on padding.
    expected_equal = [1 / 3, 1 / 3, 1 / 3, 1 / 2, 1 / 2, 0.0]
    # position: 1/(j+1) normalised; first: (1, 1/2, 1/3) / (11/6) = (6/11, 3/11, 2/11);
    # second: (1, 1/2) / (3/2) = (2/3, 1/3).
    expected_position = [6 / 11, 3 / 11, 2 / 11, 2 / 3, 1 / 3, 0.0]
    # unit: the last token of each macro action.
    expected_unit = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    # start: the first token of each macro action (V at the state where it begins).
    expected_start = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    for name, expected in [
        ("equal", expected_equal),
        ("position", expected_position),
        ("unit", expected_unit),
        ("start", expected_start),
    ]:
        torch.testing.assert_close(macro_weights(seg, name), torch.tensor([expected]))
    with pytest.raises(ValueError, match="value_function"):
        macro_weights(seg, "median")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("value_function", ["equal", "position", "unit", "start"])
def test_weights_sum_to_one_and_to_macro_matches_loop(seed, value_function):
    macro_end, mask = random_layout(seed)
    seg = build_segments(macro_end, mask)
    w = macro_weights(seg, value_function)
    x = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = torch.where(mask, x, torch.full_like(x, float("nan")))  # padding must not leak
    y_plain = to_macro(x, seg)
    y_weighted = to_macro(x, seg, w.to(x.dtype))
    for b, macros in enumerate(loop_macros(macro_end, mask)):
        for k, tokens in enumerate(macros):
            assert w[b, tokens].sum().item() == pytest.approx(1.0)
            assert y_plain[b, k].item() == pytest.approx(sum(x[b, t].item() for t in tokens))
            expected = sum(w[b, t].item() * x[b, t].item() for t in tokens)
            assert y_weighted[b, k].item() == pytest.approx(expected)
        assert (y_plain[b, len(macros) :] == 0).all()
    back = to_tokens(y_plain, seg)
    for b, macros in enumerate(loop_macros(macro_end, mask)):
        for k, tokens in enumerate(macros):
            for t in tokens:
                assert back[b, t] == y_plain[b, k]
    assert (back[~mask] == 0).all()


def test_doctests():
    assert doctest.testmod(segments_module).failed == 0
