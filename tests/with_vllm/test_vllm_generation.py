"""The vLLM backend through the generation registry: PPO's held-out evaluation and ``marlhf infer``
checked as every backend is (``tests/support/generation_checks.py``; the main suite runs them for
the others). Runs where vLLM is installed (``make test-vllm``: ``.venv-vllm``)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from tests.inference.conftest import assets  # noqa: E402, F401 - the inference tests' models
from tests.support.generation_checks import check_evaluation, check_inference  # noqa: E402

pytestmark = pytest.mark.slow


def test_evaluation_on_vllm(tmp_path_factory):
    check_evaluation("vllm", tmp_path_factory.mktemp("eval_cache"))


def test_inference_on_vllm(assets, tmp_path):  # noqa: F811
    check_inference("vllm", assets, tmp_path)
