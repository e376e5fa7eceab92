"""The packing helpers' worked examples (their docstrings) hold."""

import doctest

import marlhf.models.sequences as sequences


def test_doctests():
    result = doctest.testmod(sequences)
    assert result.failed == 0 and result.attempted >= 2
