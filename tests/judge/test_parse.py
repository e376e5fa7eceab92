import doctest
import itertools

import pytest

import marlhf.judge.parse as parse_mod
from marlhf.judge.parse import combine, parse_criteria, parse_reason, parse_verdict, to_model


def test_doctests():
    assert doctest.testmod(parse_mod).failed == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Reason: crisper.\nVerdict: [[A]]", "A"),
        ("Reason: x\nVerdict: [[B]]\n\n", "B"),
        ("Reason: x\nVerdict: [[TIE]]", "tie"),
        ("Reason: x\nverdict: [[tie]]", "tie"),
        ("Reason: x\n**Verdict:** [[A]]", "A"),
        ("Verdict: [[ b ]].", "B"),
        # everything below is not the strict format: invalid, never guessed
        ("Reason: x\nVerdict: A", "invalid"),
        ("A is clearly better.", "invalid"),
        ("Verdict: [[A]]\nBut on reflection B is better.", "invalid"),
        ("Verdict: [[A]]\nVerdict: [[B]]", "invalid"),
        ("Verdict: [[A]]\nVerdict: [[A]]", "invalid"),
        ("Verdict: [[C]]", "invalid"),
        ("Verdict: [[A]] or [[B]]", "invalid"),
        ("", "invalid"),
        (None, "invalid"),
        ('{"comparison": "...", "choice": "A"}', "invalid"),
    ],
)
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


def test_parse_reason():
    assert parse_reason("Reason: A keeps the key fact.\nVerdict: [[A]]") == "A keeps the key fact."
    assert parse_reason("Verdict: [[A]]") == ""


def test_parse_criteria_webgpt_reply():
    reply = (
        "Reason: A cites the source correctly.\n"
        "Factual accuracy: [[A]]\nCoherence: [[TIE]]\nOverall usefulness: [[B]]\nVerdict: [[A]]"
    )
    crit = ("Factual accuracy", "Coherence", "Overall usefulness")
    assert parse_criteria(reply, crit) == {
        "Factual accuracy": "A",
        "Coherence": "tie",
        "Overall usefulness": "B",
    }
    assert parse_verdict(reply) == "A"
    # a missing criterion line is invalid for that criterion only
    assert parse_criteria("Coherence: [[B]]", crit)["Factual accuracy"] == "invalid"


def test_to_model_table():
    # hand-written table: order 'ab' shows a as A, order 'ba' shows b as A
    table = {
        ("A", "ab"): "a",
        ("B", "ab"): "b",
        ("A", "ba"): "b",
        ("B", "ba"): "a",
        ("tie", "ab"): "tie",
        ("tie", "ba"): "tie",
        ("invalid", "ab"): "invalid",
        ("invalid", "ba"): "invalid",
    }
    for (v, order), expected in table.items():
        assert to_model(v, order) == expected
    with pytest.raises(ValueError):
        to_model("A", "xy")


def test_combine_rule_against_plain_definition():
    outcomes = ("a", "b", "tie", "invalid")
    for x, y in itertools.product(outcomes, outcomes):
        if x == "invalid" or y == "invalid":
            expected = "invalid"
        elif x == y:
            expected = x
        else:
            expected = "tie"  # orders disagree -> tie, including a win against a tie
        assert combine(x, y) == expected
        assert combine(y, x) == expected


def test_position_biased_judge_gives_tie():
    # a judge that always answers "A" prefers a in one order and b in the other
    assert combine(to_model("A", "ab"), to_model("A", "ba")) == "tie"
