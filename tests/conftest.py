"""Test-wide environment: one BLAS thread (DeepSpeed step times swing wildly otherwise on 2 cores)
and no hub access (nothing can be downloaded here; offline fails fast instead of retrying)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped where torch sees no CUDA GPU."""
    if torch.cuda.is_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a CUDA GPU (run there with pytest -m cuda)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
