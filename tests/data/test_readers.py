"""The JSON-lines reader the result files, the judge's inputs and the labelled samples share
(``marlhf.data.readers.json_lines``); the dataset files' own readers are tested through
``tests/data/test_adapters.py``."""

from __future__ import annotations

import doctest

import pytest

import marlhf.data.readers as readers
from marlhf.data.readers import json_lines
from marlhf.data.schema import DataError


def test_doctests():
    assert doctest.testmod(readers, raise_on_error=False).failed == 0


def test_json_lines_numbers_the_lines_of_the_file_and_skips_blank_ones(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n"text"\n')
    with open(path) as f:
        assert list(json_lines(f, path)) == [(1, {"a": 1}), (4, {"a": 2}), (5, "text")]


@pytest.mark.parametrize("error", [DataError, ValueError, RuntimeError])
def test_json_lines_raises_the_callers_error_naming_line_and_column(tmp_path, error):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 1, "b" 2}\n')
    with open(path) as f, pytest.raises(error) as raised:
        list(json_lines(f, path, error))
    # column 14: the space after "b" where the colon belongs (1-based, as an editor counts)
    assert str(raised.value) == (
        f"{path} line 2: not valid JSON at column 14 (Expecting ':' delimiter)"
    )
