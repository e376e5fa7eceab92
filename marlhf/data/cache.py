"""A disk cache for tokenised datasets, keyed by everything that changes them.

The key (a JSON-able dict: data paths with local files' mtimes and sizes, split, phase, seed,
tokenizer name and vocabulary hash, max lengths, template version, eot token, ...) is hashed with
SHA-256 over its canonical JSON. The local-rank-0 process of each node builds the dataset and saves
it atomically (``save_to_disk`` into a temporary directory, then a rename); the other ranks wait at
a collective (when distributed is initialised) and load it. A builder's failure reaches every rank
(the waiting ranks raise :class:`BuilderFailed`, so none waits for a rank that has exited). An
existing key loads, a changed key builds a new entry.

An empty dataset is never saved (the builders raise first, with counts; ``datasets`` cannot even load
an empty set saved without features), and an entry that does not load (an empty set an older version
saved, a partial copy) is rebuilt with a warning instead of failing on every run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import datasets
import torch.distributed as dist

from marlhf.data.schema import DataError

log = logging.getLogger(__name__)


def key_hash(key: dict) -> str:
    """SHA-256 hex digest of ``key``'s canonical JSON (sorted keys, no whitespace)."""
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _dist():
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _load(path: Path) -> datasets.Dataset | None:
    """The entry at ``path``, or None when it does not load or is empty."""
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception:  # noqa: BLE001 - whatever a damaged entry raises, rebuilding is the cure
        return None
    return ds if len(ds) > 0 else None


class BuilderFailed(RuntimeError):
    """Raised on the ranks that waited for a data build that failed on rank ``rank``; that rank
    raises (and reports) the error itself. ``data_error``: whether it was a ``DataError``."""

    def __init__(self, rank: int, text: str, data_error: bool):
        super().__init__(f"rank {rank}: {text}")
        self.rank, self.data_error = rank, data_error


def _share_failure(dist, error: BaseException | None) -> None:
    """Every rank's build outcome to every rank; a rank whose own build did not fail raises
    :class:`BuilderFailed` for the first rank whose build did (instead of the others waiting at a
    barrier for a rank that has exited, until the launcher or the timeout ends them)."""
    mine = None if error is None else (str(error), isinstance(error, DataError))
    outcomes: list = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, mine)
    if error is None:
        for rank, outcome in enumerate(outcomes):
            if outcome is not None:
                raise BuilderFailed(rank, *outcome)


def _build(path: Path, key: dict, build: Callable[[], datasets.Dataset]) -> None:
    """Build the dataset and save it as ``path`` atomically (a temporary directory, then a rename)."""
    log.info("data cache miss: building %s", path)
    ds = build()
    if len(ds) == 0:
        raise ValueError(f"refusing to cache an empty dataset as {path} (the builder should raise)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        was_on = datasets.is_progress_bar_enabled()  # a bar per save is noise in a run's log
        datasets.disable_progress_bars()
        try:
            ds.save_to_disk(str(tmp))
        finally:
            if was_on:
                datasets.enable_progress_bars()
        (tmp / "marlhf_cache_key.json").write_text(
            json.dumps(key, sort_keys=True, indent=1, default=str)
        )
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.exists():  # another node's builder won the race otherwise
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached(
    cache_dir: str | os.PathLike, key: dict, build: Callable[[], datasets.Dataset]
) -> datasets.Dataset:
    """Load the dataset stored under ``key`` in ``cache_dir``, building and saving it if absent."""
    path = Path(cache_dir) / key_hash(key)
    dist = _dist()
    # Without torch.distributed every process builds for itself (no one to wait for).
    builder = dist is None or int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0
    loaded = _load(path) if builder and path.exists() else None
    if builder and path.exists() and loaded is None:
        log.warning("data cache entry %s does not load or is empty: rebuilding it", path)
        shutil.rmtree(path)
    error = None
    if builder and not path.exists():
        try:
            _build(path, key, build)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, then it is re-raised
            error = e
    if dist and dist.get_world_size() > 1:
        _share_failure(dist, error)  # a collective: the ranks wait here for the builders
    if error is not None:
        raise error
    # a hit on a builder is loaded once (above); a fresh build and the other ranks load it here
    return loaded if loaded is not None else datasets.load_from_disk(str(path))
