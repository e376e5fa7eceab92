import doctest

import numpy as np

import marlhf.runtime.batching as batching
from marlhf.runtime.batching import (
    epoch_permutation,
    eval_shard,
    padded_eval_shard,
    step_micro_batches,
    steps_per_epoch,
)


def test_doctest():
    assert doctest.testmod(batching).failed == 0


def test_two_ranks_see_the_same_examples_as_one_with_same_global_batch():
    perm = epoch_permutation(103, seed=7, epoch=2)
    for step in range(steps_per_epoch(103, 4, 1, 1)):
        one = step_micro_batches(perm, step, micro=4, accumulation=1, world=1, rank=0)
        two = [
            step_micro_batches(perm, step, micro=2, accumulation=1, world=2, rank=r)[0]
            for r in (0, 1)
        ]
        assert sorted(one[0]) == sorted(two[0] + two[1])


def test_epoch_covers_without_repetition():
    n, micro, acc, world = 50, 3, 2, 2
    perm = epoch_permutation(n, 0, 0)
    seen = []
    for step in range(steps_per_epoch(n, micro, acc, world)):
        for r in range(world):
            for mb in step_micro_batches(perm, step, micro, acc, world, r):
                seen.extend(mb)
    assert len(seen) == len(set(seen)) == (n // 12) * 12


def test_permutation_deterministic_and_epoch_dependent():
    assert np.array_equal(epoch_permutation(20, 1, 0), epoch_permutation(20, 1, 0))
    assert not np.array_equal(epoch_permutation(20, 1, 0), epoch_permutation(20, 1, 1))


def test_eval_shard_partitions():
    shards = [sum(eval_shard(11, 2, 3, r), []) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(11))
    assert eval_shard(11, 2, 1, 0, max_batches=2) == [[0, 1], [2, 3]]


def test_padded_eval_shard_same_count_on_every_rank_real_rows_once():
    """Every rank gets as many batches (ZeRO-3 forwards in step); the real batches cover each row of
    the evaluated prefix exactly once: all ``n`` rows, or with ``max_batches`` the first
    ``max_batches * batch`` rows of each rank's stride (a plain loop here)."""
    for n in range(0, 23):
        for batch in (1, 2, 3, 5):
            for world in (1, 2, 3, 4):
                for max_batches in (0, 1, 2):
                    shards = [
                        padded_eval_shard(n, batch, world, r, max_batches) for r in range(world)
                    ]
                    assert len({len(s) for s in shards}) == 1, (n, batch, world, max_batches)
                    # no more forward passes than the longest real shard needs
                    assert len(shards[0]) == max(sum(ok for _, ok in s) for s in shards)
                    want = []
                    for r in range(world):
                        stride = [i for i in range(n) if i % world == r]
                        want += stride[: max_batches * batch] if max_batches else stride
                    real = [i for s in shards for idx, ok in s if ok for i in idx]
                    assert sorted(real) == sorted(want) and len(set(real)) == len(real)
                    for s in shards:
                        assert all(0 < len(idx) <= batch and max(idx) < n for idx, _ in s)
                        flags = [ok for _, ok in s]
                        assert flags == sorted(flags, reverse=True)  # the padding comes last
