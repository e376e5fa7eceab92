"""The worked examples in the docstrings of marlhf.inference and its modules."""

import doctest

import marlhf.inference as inference


def test_doctests():
    import importlib
    import pkgutil

    assert doctest.testmod(inference, raise_on_error=False).failed == 0
    attempted = 0
    for info in pkgutil.iter_modules(inference.__path__):  # the package's modules have doctests too
        mod = importlib.import_module(f"marlhf.inference.{info.name}")
        res = doctest.testmod(mod, raise_on_error=False)
        assert res.failed == 0, info.name
        attempted += res.attempted
    assert attempted >= 6  # select_prompts, left_pad
