"""Where results go: dataset specs, model and dataset names, the output path and its sidecars (the
naming rule is in the package doc)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from marlhf.data.names import DATASETS, canonical
from marlhf.inference.config import InferenceConfig


def dataset_spec(name: str) -> str:
    """A short dataset name or alias -> its data-adapter spec (others unchanged)."""
    short = canonical(name)
    return DATASETS[short] if short is not None else name


_DATA_EXTENSIONS = frozenset({".jsonl", ".json", ".parquet", ".csv", ".tsv", ".arrow", ".txt"})


def _safe_name(parts: Sequence[str]) -> str:
    name = "-".join(parts) or "model"
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", name)


def _parts(path: str) -> list[str]:
    return [p for p in re.split(r"[\\/]+", os.path.normpath(path)) if p not in ("", ".", "..")]


def model_name(path: str, proj_path: str | None = None) -> str:
    """A file-name-safe name for a model (module doc, naming rule): its path relative to
    ``proj_path`` when it lies inside it, else its last three path components, joined with ``-``."""
    if proj_path is not None:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(proj_path))
        if rel != "." and not rel.startswith(".."):
            return _safe_name(_parts(rel))
    return _safe_name(_parts(path)[-3:])


def dataset_dir_name(dataset: str) -> str:
    """The results directory of a dataset (module doc, naming rule)."""
    short = canonical(dataset)
    if short is not None:
        return short
    spec = dataset.split(":", 1)[1] if ":" in dataset and not os.path.exists(dataset) else dataset
    last = (_parts(spec) or ["data"])[-1]
    root, ext = os.path.splitext(last)
    if root and ext.lower() in _DATA_EXTENSIONS:
        last = root
    return _safe_name([last])


def output_path(cfg: InferenceConfig) -> str:
    """``--output`` or ``<proj_path>/results/<dataset>/temperature=<T>/<model_name>.jsonl``."""
    if cfg.output:
        return cfg.output
    if cfg.ref_scores:
        name = "ref-scores-" + model_name(cfg.reward_model or "rm", cfg.proj_path)
    else:
        name = model_name(cfg.model, cfg.proj_path)
    return os.path.join(
        cfg.proj_path,
        "results",
        dataset_dir_name(cfg.dataset),
        f"temperature={cfg.sampling.temperature}",
        f"{name}.jsonl",
    )


def sidecar(path: str, kind: str) -> str:
    """``<output>.<kind>.json`` next to the output (kind: meta, summary)."""
    return f"{path}.{kind}.json"
