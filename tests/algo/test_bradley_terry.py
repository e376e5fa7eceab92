import doctest
import math

import pytest
import torch

import marlhf.algo.bradley_terry as bt_module
from marlhf.algo.bradley_terry import bt_loss, preference_metrics, split_pair


def _neg_log_sigmoid(x: float) -> float:
    return math.log1p(math.exp(-x))


def test_doctests():
    assert doctest.testmod(bt_module).failed == 0


def test_split_pair_takes_chosen_rows_then_rejected_rows():
    x = torch.arange(12).reshape(6, 2)  # (2B=6, T=2)
    chosen, rejected = split_pair(x)
    assert chosen.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert rejected.tolist() == [[6, 7], [8, 9], [10, 11]]


def test_split_pair_rejects_odd_batch():
    with pytest.raises(ValueError, match="2B"):
        split_pair(torch.zeros(3, 4))


def test_bt_loss_matches_hand_computation():
    chosen = torch.tensor([1.0, 0.0, 2.0])
    rejected = torch.tensor([0.0, 1.0, -1.0])
    # differences 1, -1, 3
    expected = (_neg_log_sigmoid(1) + _neg_log_sigmoid(-1) + _neg_log_sigmoid(3)) / 3
    assert bt_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)


def test_bt_loss_with_margin():
    chosen = torch.tensor([1.0, 0.0, 2.0])
    rejected = torch.tensor([0.0, 1.0, -1.0])
    margin = torch.tensor([0.5, 0.0, 4.0])
    # differences minus margin: 0.5, -1, -1
    expected = (_neg_log_sigmoid(0.5) + 2 * _neg_log_sigmoid(-1)) / 3
    assert bt_loss(chosen, rejected, margin).item() == pytest.approx(expected, rel=1e-6)


def test_bt_loss_with_centering():
    chosen = torch.tensor([1.0, 0.0, 2.0])
    rejected = torch.tensor([0.0, 1.0, -1.0])
    # sums 1, 1, 1 -> mean of squares 1
    expected = (_neg_log_sigmoid(1) + _neg_log_sigmoid(-1) + _neg_log_sigmoid(3)) / 3 + 0.1 * 1.0
    assert bt_loss(chosen, rejected, center_coef=0.1).item() == pytest.approx(expected, rel=1e-6)


def test_bt_loss_is_stable_for_large_gaps_and_low_precision():
    chosen = torch.tensor([100.0, -100.0], dtype=torch.bfloat16)
    rejected = torch.zeros(2, dtype=torch.bfloat16)
    loss = bt_loss(chosen, rejected)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(50.0, rel=1e-3)  # (~0 + 100) / 2


def test_bt_loss_gradient_pushes_chosen_up_and_rejected_down():
    chosen = torch.zeros(2, requires_grad=True)
    rejected = torch.zeros(2, requires_grad=True)
    bt_loss(chosen, rejected).backward()
    # d/dc -log σ(c - r) = -σ(r - c) = -1/2 at 0, averaged over B = 2
    assert chosen.grad.tolist() == pytest.approx([-0.25, -0.25])
    assert rejected.grad.tolist() == pytest.approx([0.25, 0.25])


def test_bt_loss_shape_errors():
    with pytest.raises(ValueError, match="chosen and rejected"):
        bt_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="margin"):
        bt_loss(torch.zeros(3), torch.zeros(3), margin=torch.zeros(2))


def test_preference_metrics_by_hand():
    chosen = torch.tensor([3.0, 1.0, 2.0, 0.0])
    rejected = torch.tensor([1.0, 1.0, 4.0, -2.0])
    m = preference_metrics(chosen, rejected)
    # wins: yes, tie, no, yes -> (1 + 0.5 + 0 + 1) / 4
    assert m["accuracy"].item() == pytest.approx(0.625)
    assert m["chosen_mean"].item() == pytest.approx(1.5)
    assert m["rejected_mean"].item() == pytest.approx(1.0)
    assert m["margin_mean"].item() == pytest.approx(0.5)
    scores = [3.0, 1.0, 2.0, 0.0, 1.0, 1.0, 4.0, -2.0]
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    assert m["score_std"].item() == pytest.approx(std)
