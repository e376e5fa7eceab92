"""Tests for marlhf.rewards.math_answers (``--reward_source math``): answers equal in value but
not in text are right, others wrong, a reference math-verify cannot read is named."""

import pytest

from marlhf.rewards.math_answers import MathAnswers, answers_match, reference_answer
from marlhf.rewards.terms import RewardBatch, RewardError


@pytest.mark.parametrize(
    ("reference", "response"),
    [
        ("0.5", "So the answer is \\boxed{\\frac{1}{2}}"),
        ("\\frac{1}{2}", "The answer is 0.5"),
        ("1/2", "0.5"),
        ("50%", "0.5"),
        ("\\sqrt{2}/2", "\\boxed{\\frac{1}{\\sqrt{2}}}"),
        ("1,000", "1000"),
        ("3", "x = 3"),
    ],
)
def test_equal_in_value_not_in_text(reference, response):
    assert reference != response
    assert answers_match(reference, response)


@pytest.mark.parametrize(
    ("reference", "response"), [("2", "the answer is 3"), ("\\frac{1}{3}", "0.33"), ("-4", "4")]
)
def test_different_values_are_wrong(reference, response):
    assert not answers_match(reference, response)


def test_the_answer_column_then_the_solution_column():
    both = {"columns": {"answer": "7", "solution": "... so \\boxed{8}"}}
    assert reference_answer(both) == "7"
    assert reference_answer({"columns": {"solution": "... so \\boxed{8}"}}) == "... so \\boxed{8}"
    assert reference_answer({"columns": {"answer": 12}}) == "12"
    assert reference_answer({"columns": {"answer": "  "}}) is None and reference_answer({}) is None


def test_the_source_scores_a_batch_and_names_rows_it_cannot_score():
    metas = [
        {"columns": {"answer": "0.25"}},
        {"columns": {"solution": "Add them: \\boxed{\\frac{3}{4}}"}},
        {"columns": {"answer": "5"}},
    ]
    batch = RewardBatch(["p0", "p1", "p2"], ["1/4", "it is 0.75", "6"], metas)
    (term,) = MathAnswers()(batch)
    assert term.name == "math" and term.values.tolist() == [1.0, 1.0, 0.0]
    bad = RewardBatch(["p0", "q1"], ["1", "2"], [metas[0], {"columns": {"answer": "banana"}}])
    with pytest.raises(
        RewardError, match=r"--reward_source math, row 1 .*'q1'.*cannot parse .*'banana'"
    ):
        MathAnswers()(bad)
    (term,) = MathAnswers("zero")(bad)
    assert term.values.tolist() == [0.0, 0.0] and term.errors == 1
