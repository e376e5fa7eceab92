"""PPO's held-out evaluation (marlhf.stages.ppo.evaluation) on every generation backend: its
``eval/*`` are its responses scored again row by row, it leaves the training's random state as it
was, and a seeding backend's held-out rows are its rows alone (``tests/support/generation_checks.py``;
vLLM's in ``tests/with_vllm/test_vllm_generation.py``)."""

from __future__ import annotations

import pytest

from tests.models.test_generation import MAIN_SUITE
from tests.support.generation_checks import check_evaluation


@pytest.mark.parametrize("backend", MAIN_SUITE)
def test_evaluation_on_every_backend(backend, tmp_path_factory):
    check_evaluation(backend, tmp_path_factory.mktemp("eval_cache"))
