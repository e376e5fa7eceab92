import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marlhf.data.split as split_mod
from marlhf.data.split import phase_indices, split_bounds


def test_doctests():
    assert doctest.testmod(split_mod).failed == 0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 500),
    w=st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
    seed=st.integers(0, 2**31 - 1),
)
def test_disjoint_covering_deterministic(n, w, seed):
    spec = ",".join(map(str, w))
    parts = [phase_indices(n, spec, p, seed) for p in (1, 2, 3)]
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(n))  # disjoint and covering
    for p in (1, 2, 3):
        assert np.array_equal(parts[p - 1], phase_indices(n, spec, p, seed))
    # Sizes follow the weights up to the cumulative rounding (within one row).
    for p, part in enumerate(parts):
        assert abs(len(part) - n * w[p] / sum(w)) <= 1.0 + 1e-9


def test_hand_worked_example():
    # 2,4,4 of 10 rows: boundaries round(0.2*10)=2, round(0.6*10)=6, 10.
    assert split_bounds(10, "2,4,4") == [0, 2, 6, 10]
    perm = np.random.RandomState(1234).permutation(10)
    assert phase_indices(10, "2,4,4", 1, 1234).tolist() == perm[:2].tolist()
    assert phase_indices(10, "2,4,4", 2, 1234).tolist() == perm[2:6].tolist()
    assert phase_indices(10, "2,4,4", 3, 1234).tolist() == perm[6:].tolist()


def test_apps_split_has_empty_rm_part():
    assert len(phase_indices(100, "2,0,8", 2, 1234)) == 0
    assert len(phase_indices(100, "2,0,8", 1, 1234)) == 20


def test_seed_changes_split():
    assert not np.array_equal(phase_indices(100, "2,4,4", 1, 1), phase_indices(100, "2,4,4", 1, 2))


def test_bad_phase():
    with pytest.raises(ValueError, match="phase"):
        phase_indices(10, "2,4,4", 4, 0)
