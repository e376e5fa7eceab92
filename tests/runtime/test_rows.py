"""Global rows, the step's prompts per row, and the per-row seeds: independent of the split over
ranks and generation batches."""

import doctest

import numpy as np
import pytest
import torch

import marlhf.runtime.rows as rows_module
from marlhf.runtime.batching import step_micro_batches
from marlhf.runtime.rows import derive_row_seeds, global_rows, step_prompt_indices


def test_doctests():
    assert doctest.testmod(rows_module).failed == 0


@pytest.mark.parametrize(
    "world,batch,batches,G", [(1, 8, 1, 4), (2, 2, 2, 4), (2, 4, 1, 2), (4, 1, 2, 8), (3, 2, 1, 3)]
)
def test_each_prompt_is_sampled_G_times_on_consecutive_global_rows(world, batch, batches, G):
    """Whatever the split over ranks and generation batches, global row i of step s answers prompt
    perm[s·R/G + i // G]: the union over ranks is one process's rollout, rank by global row."""
    R = world * batch * batches
    perm = np.random.RandomState(0).permutation(100)
    for step in (0, 3):
        by_row = {}
        for r in range(world):
            idx = sum(
                step_prompt_indices(
                    perm, step, batch=batch, batches=batches, world=world, rank=r,
                    samples_per_prompt=G,
                ),
                [],
            )  # fmt: skip
            for row, p in zip(
                global_rows(batch * batches, batch, r, world).tolist(), idx, strict=True
            ):
                by_row[row] = p
        assert sorted(by_row) == list(range(R))
        one = [perm[step * (R // G) + i // G] for i in range(R)]
        assert [by_row[i] for i in range(R)] == one
        assert len(set(one)) == R // G  # R / G distinct prompts, G rows each


def test_one_sample_per_prompt_is_the_usual_batching():
    perm = np.random.RandomState(1).permutation(64)
    for world, batch, batches in ((1, 4, 2), (2, 2, 2), (2, 3, 1)):
        for r in range(world):
            for step in (0, 2):
                assert step_prompt_indices(
                    perm, step, batch=batch, batches=batches, world=world, rank=r,
                    samples_per_prompt=1,
                ) == step_micro_batches(perm, step, batch, batches, world, r)  # fmt: skip


def test_global_rows_follow_the_batching_of_prompts():
    """A rank's rows are numbered as in one process with the whole batch: with the identity
    permutation, step 0's prompt indices (`step_micro_batches`) are the global row indices."""
    for world, block, batches in ((1, 4, 2), (2, 2, 2), (3, 1, 4), (2, 3, 1)):
        perm = np.arange(world * block * batches)
        seen = []
        for r in range(world):
            idx = sum(step_micro_batches(perm, 0, block, batches, world, r), [])
            assert global_rows(block * batches, block, r, world).tolist() == idx
            seen += idx
        assert sorted(seen) == perm.tolist()
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(global_rows, "global_rows", globs={"global_rows": global_rows}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries == 1


def test_derive_row_seeds():
    # SplitMix64 against its published reference outputs (seed 0, and seed 1234567's first five)
    golden = 0x9E3779B97F4A7C15
    assert rows_module._splitmix64(0) == 0xE220A8397B1DCDAF
    assert [rows_module._splitmix64((1234567 + i * golden) % 2**64) for i in range(5)] == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    rows = torch.tensor([0, 3, 17, 2**40])
    seeds = derive_row_seeds(1234, 5, rows)
    assert seeds.dtype == torch.long and seeds.shape == (4,)
    assert bool(((seeds >= 0) & (seeds < 2**32)).all())
    # a row's seed depends on its own index only, not on the other rows
    for i in range(4):
        assert int(derive_row_seeds(1234, 5, rows[i : i + 1])) == int(seeds[i])
    # and on seed, step and stream: 4 x 3 x 2 x 50 rows, all different
    grid = torch.cat(
        [
            derive_row_seeds(seed, step, torch.arange(50), stream)
            for seed in (0, 1, 1234, -1)
            for step in (0, 1, 2)
            for stream in (0, 1)
        ]
    )
    assert len(set(grid.tolist())) == grid.numel()
