import doctest

import pytest

import marlhf.judge.prompts as prompts_mod
from marlhf.judge.parse import parse_verdict
from marlhf.judge.prompts import TEMPLATES, get_template, render


def test_doctests():
    assert doctest.testmod(prompts_mod).failed == 0


@pytest.mark.parametrize("name", ["summarize", "hh-rlhf", "webgpt"])
def test_template_renders_both_responses_in_order(name):
    t = get_template(name)
    msgs = render(t, prompt="THE PROMPT {braces}", first="FIRST RESPONSE", second="SECOND RESPONSE")
    user = msgs[-1]["content"]
    assert "THE PROMPT {braces}" in user
    assert user.index("FIRST RESPONSE") < user.index("SECOND RESPONSE")
    assert "Verdict: [[A]]" in user and "[[TIE]]" in user
    assert t.version.startswith(name)
    # the instruction itself must not be parseable as a verdict (it ends with the rules, not a verdict)
    assert parse_verdict(user) == "invalid"


def test_versions_unique_and_webgpt_criteria():
    versions = [t.version for t in TEMPLATES.values()]
    assert len(set(versions)) == len(versions)
    assert get_template("webgpt").criteria == (
        "Factual accuracy",
        "Coherence",
        "Overall usefulness",
    )
    for c in get_template("webgpt").criteria:
        assert f"{c}: [[A]]" in get_template("webgpt").user


def test_unknown_dataset_names_flag():
    with pytest.raises(ValueError, match="--dataset"):
        get_template("tldr")
