"""The result file (marlhf.inference.results): the summary by hand, a corrupt line named."""

import pytest

from marlhf.inference import (
    read_rows,
    summarize,
)


def test_summary_hand_worked():
    rows = [
        {"prompt_id": "a", "reward": 1.0, "response_tokens": 2, "ends_with_eos": True},
        {"prompt_id": "b", "reward": 2.0, "response_tokens": 4, "ends_with_eos": False},
        {"prompt_id": "c", "reward": 3.0, "response_tokens": 6, "ends_with_eos": True},
    ]
    s = summarize(rows)
    assert (s["n"], s["reward_mean"], s["reward_std"], s["response_tokens_mean"]) == (
        3,
        2.0,
        1.0,
        4.0,
    )
    assert s["eos_rate"] == pytest.approx(2 / 3)
    code = [
        {"prompt_id": "a", "reward": 0.4, "rewards": [1, 1, 0, 0, 0], "n_correct": 2},
        {"prompt_id": "b", "reward": 0.0, "rewards": [0, 0, 0, 0, 0], "n_correct": 0},
    ]
    s = summarize(code, pass_k=(1, 2, 5))
    # pass@k = 1 - C(n-c, k) / C(n, k): (2/5 + 0)/2; (1 - 3/10 + 0)/2; (1 + 0)/2
    assert s["pass@1"] == pytest.approx(0.2)
    assert s["pass@2"] == pytest.approx(0.35)
    assert s["pass@5"] == pytest.approx(0.5)


def test_corrupt_result_line_names_line_and_column(tmp_path):
    """A corrupt line of a result file read by inference: the JSON error keeps its column."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_id": "a"}\n{"prompt_id": "b", "response": "x\ty"}\n')
    with pytest.raises(
        ValueError, match=r"r\.jsonl line 2: not valid JSON at column 34 \(Invalid control"
    ):
        read_rows(str(path))
