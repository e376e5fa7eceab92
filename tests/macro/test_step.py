"""The ``step`` rule: reasoning steps as macro actions, cut at ``--step_delimiter`` in the decoded
text. References: the text split on the delimiter by ``re`` (independent of the rule's token
arithmetic), with the tiny model's real tokenizer and with a character tokenizer."""

import re

import pytest
import torch

from marlhf.macro.config import MacroConfig
from marlhf.macro.termination import TerminationInputs, build_termination
from marlhf.models.load import resolve_model_path


def _cfg(**kw) -> MacroConfig:
    return MacroConfig(termination_condition="step", eos_own_macro=False, **kw)


def _batch(rows: list[list[int]], width: int | None = None):
    width = width or max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = True
    return TerminationInputs(ids, mask, torch.zeros(len(rows), dtype=torch.bool))


def _pieces(rule, row: list[int], tok) -> list[str]:
    ends = rule(_batch([row])).macro_end[0].nonzero()[:, 0].tolist()
    out, start = [], 0
    for e in ends:
        out.append("".join(tok.decode([t]) for t in row[start : e + 1]))
        start = e + 1
    return out


class Chars:
    """A tokenizer whose tokens are characters (``decode`` of one id is its character)."""

    def decode(self, ids, **kw):
        return "".join(chr(i) for i in ids)


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_steps_are_the_lines_of_a_solution_with_the_tiny_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-base"))
    text = "start with 7 .\n1 : plus 5 to 7 is 12\n2 : minus 3 from 12 is 9\nanswer : 9"
    row = tok(text, add_special_tokens=False)["input_ids"]
    rule = build_termination(_cfg(), tok)
    pieces = _pieces(rule, row, tok)
    # the reference: the decoded text split after each newline
    joined = "".join(tok.decode([t]) for t in row)
    want = [p for p in re.split(r"(?<=\n)", joined) if p]
    assert pieces == want and len(pieces) == 4


def test_a_delimiter_that_spans_tokens_ends_at_its_last_character():
    rule = build_termination(_cfg(step_delimiter=r"\. "), Chars())
    assert _pieces(rule, _chars("a. b. c"), Chars()) == ["a. ", "b. ", "c"]
    rule = build_termination(_cfg(step_delimiter=r"Step \d+:"), Chars())
    assert _pieces(rule, _chars("Step 1: x Step 2: y"), Chars()) == ["Step 1:", " x Step 2:", " y"]


def test_rows_are_cut_alone_whatever_the_batch():
    rule = build_termination(_cfg(), Chars())
    rows = [_chars("ab\ncd\ne"), _chars("x\n\ny"), _chars("no delimiter"), []]
    together = rule(_batch(rows, width=20)).macro_end
    for b, row in enumerate(rows):
        alone = rule(_batch([row] if row else [[0]], width=len(row) or 1)).macro_end[0]
        if row:
            assert together[b, : len(row)].tolist() == alone.tolist()
        assert not together[b, len(row) :].any()  # never on padding
    assert together[1, :4].tolist() == [False, True, True, True]  # an empty step between newlines


def test_eos_own_macro_and_the_last_token_end_a_step():
    cfg = MacroConfig(termination_condition="step", eos_own_macro=True)
    rule = build_termination(cfg, Chars())
    inputs = _batch([_chars("a\nbc$")])
    inputs.ends_with_eos[:] = True
    ends = rule(inputs).macro_end[0].nonzero()[:, 0].tolist()
    assert ends == [1, 3, 4]  # the newline, the token before the final EOS, the EOS


@pytest.mark.parametrize(
    ("delimiter", "problem"),
    [("(", "is no regular expression"), ("x*", "matches the empty text")],
)
def test_bad_delimiters_are_refused_naming_the_flag(delimiter, problem):
    with pytest.raises(ValueError, match=rf"--step_delimiter .*{problem}"):
        _cfg(step_delimiter=delimiter)


def test_the_rule_needs_the_tokenizer():
    with pytest.raises(ValueError, match="step needs the policy tokenizer"):
        build_termination(_cfg())
