"""``marlhf infer`` on every generation backend (``--generation_backend``): rewards of the rows'
own tokens, the backend recorded with the output, reproducible samples, batch-independent ones for
a seeding backend (``tests/support/generation_checks.py``; vLLM's in
``tests/with_vllm/test_vllm_generation.py``)."""

from __future__ import annotations

import pytest

from tests.models.test_generation import MAIN_SUITE
from tests.support.generation_checks import check_inference


@pytest.mark.parametrize("backend", MAIN_SUITE)
def test_inference_on_every_backend(backend, assets, tmp_path):
    check_inference(backend, assets, tmp_path)
