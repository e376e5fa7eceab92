import doctest
import math

import torch

import marlhf.data.collate as C


def test_doctests():
    assert doctest.testmod(C).failed == 0


def test_sft_right_pad_hand_built():
    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4], "labels": [4]}]
    b = C.SFTCollator(pad_id=9)(rows)
    assert torch.equal(b["input_ids"], torch.tensor([[1, 2, 3], [4, 9, 9]]))
    assert torch.equal(b["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0]]))
    assert torch.equal(b["labels"], torch.tensor([[-100, 2, 3], [4, -100, -100]]))


def test_pair_chosen_then_rejected():
    rows = [
        {
            "chosen_input_ids": [1, 2],
            "rejected_input_ids": [1, 3, 4],
            "prompt_len": 1,
            "margin": 0.5,
        },
        {
            "chosen_input_ids": [5],
            "rejected_input_ids": [5, 6],
            "prompt_len": 1,
            "margin": float("nan"),
        },
    ]
    b = C.PairCollator(pad_id=0)(rows)
    assert torch.equal(b["input_ids"], torch.tensor([[1, 2, 0], [5, 0, 0], [1, 3, 4], [5, 6, 0]]))
    assert torch.equal(
        b["attention_mask"], torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    )
    assert b["margin"][0].item() == 0.5 and math.isnan(b["margin"][1].item())
    assert b["prompt_len"].tolist() == [1, 1]


def test_prompt_left_pad():
    rows = [
        {"input_ids": [7], "prompt_id": "a", "prompt": "x", "meta": "{}"},
        {"input_ids": [1, 2, 3], "prompt_id": "b", "prompt": "y", "meta": "{}"},
    ]
    b = C.PromptCollator(pad_id=0)(rows)
    assert torch.equal(b["input_ids"], torch.tensor([[0, 0, 7], [1, 2, 3]]))
    assert torch.equal(b["attention_mask"], torch.tensor([[0, 0, 1], [1, 1, 1]]))
    assert b["prompt_id"] == ["a", "b"] and b["prompt"] == ["x", "y"]
