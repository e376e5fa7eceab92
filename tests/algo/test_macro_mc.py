"""marlhf.algo.macro_mc: the examples of its docstrings (its functions against loops and an
enumerable policy: tests/algo/test_estimators.py, through the macro_mc estimator)."""

import doctest

import marlhf.algo.macro_mc as macro_mc


def test_doctests():
    assert doctest.testmod(macro_mc).failed == 0
