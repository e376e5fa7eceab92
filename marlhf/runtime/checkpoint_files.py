"""What a resumable checkpoint is on disk beyond DeepSpeed's own files: checksums, an in-progress
marker, stale temporaries of interrupted saves, and write errors that name the checkpoint.

A training-state tag directory ``train_state/<engine>/step-N/`` is written in three moves:

1. :func:`begin_tag` drops the marker ``SAVING`` into it (and removes an old ``checksums.json``,
   when the tag is saved again);
2. the engine writes its files;
3. :func:`finish_tag` hashes every file (the hashing is shared between ranks) and writes
   ``checksums.json`` atomically (a temporary file renamed over it), then removes the marker.

Hashing costs less than writing: SHA-256 streams at 0.6–1.0 GB/s per core on the development CPU
(which has SHA instructions; blake2b ran at 0.47–0.73 GB/s there), 4–8 ms for the tiny model's 6 MB
state against 10–14 ms for torch.save of it (``benchmarks/bench_checksums.py``, a loaded machine).

So a tag is *complete* when its manifest exists and every file it lists has the recorded size and
SHA-256 (:func:`check_tag`); a tag with the marker and no manifest was being written when the run
stopped; a tag with neither was written before checksums were recorded (accepted unverified).
The manifest lists files by path relative to the tag directory::

    {"format_version": 1, "algorithm": "sha256",
     "files": {"mp_rank_00_model_states.pt": {"bytes": 6042016, "sha256": "9f2c…"}}}

The digests are the plain SHA-256 of each file, so ``sha256sum`` checks them by hand.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from marlhf.runtime.distributed import all_gather_object, is_main, rank, world_size

log = logging.getLogger("marlhf.runtime.checkpoint")

MANIFEST_FILE = "checksums.json"
SAVING_MARKER = "SAVING"
HASH_ALGORITHM = "sha256"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20

# Temporaries an interrupted save leaves behind: safetensors writes `.tmpXXXXXX` (Rust's tempfile
# crate: ".tmp" + 6 characters) next to the target and renames it; `write_json` writes `X.json.tmp`.
_STALE_TEMP = re.compile(r"^(\.tmp[A-Za-z0-9]{6}|.+\.json\.tmp)$")
# a model checkpoint directory being written (:func:`staged_directory`), or one being replaced
PARTIAL_PREFIX = ".partial-"


# --------------------------------------------------------------------------------------------------
# checksums


def file_digest(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 8 MiB chunks (memory stays flat for any size)."""
    h = hashlib.new(HASH_ALGORITHM)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tag_files(tag_dir: Path) -> list[str]:
    """Every regular file under ``tag_dir`` (relative POSIX paths, sorted) except the manifest, the
    marker and stale temporaries."""
    out = []
    for dirpath, _, names in os.walk(tag_dir):
        for name in names:
            p = Path(dirpath, name)
            if p.is_file() and name not in (MANIFEST_FILE, SAVING_MARKER):
                if not _STALE_TEMP.match(name):
                    out.append(p.relative_to(tag_dir).as_posix())
    return sorted(out)


def hash_files(tag_dir: Path, files: list[str]) -> dict[str, str]:
    """``{file: sha256}`` of ``files`` under ``tag_dir``. Collective when distributed (every rank
    calls it with the same list): rank r hashes files r, r + world, ..., and the digests are
    gathered, so the reading is shared. A file that cannot be read gets ``"unreadable: <error>"``."""
    mine = {}
    for f in files[rank() :: world_size()]:
        try:
            mine[f] = file_digest(tag_dir / f)
        except OSError as e:
            mine[f] = f"unreadable: {e}"
    out: dict[str, str] = {}
    for part in all_gather_object(mine):
        out.update(part)
    return out


def begin_tag(tag_dir: Path) -> None:
    """Mark ``tag_dir`` as being written (rank 0; call before the engines save into it)."""
    tag_dir.mkdir(parents=True, exist_ok=True)
    (tag_dir / MANIFEST_FILE).unlink(missing_ok=True)  # a tag saved again: not complete until done
    (tag_dir / SAVING_MARKER).write_text("this checkpoint is being written\n")


def finish_tag(tag_dir: Path) -> None:
    """Record the checksums of every file of ``tag_dir`` and mark it complete. Collective when
    distributed (the hashing is shared); rank 0 writes ``checksums.json``."""
    files = tag_files(tag_dir)
    digests = hash_files(tag_dir, files)
    if not is_main():
        return
    entries = {}
    for f in files:
        if digests[f].startswith("unreadable"):
            raise OSError(errno.EIO, f"checkpoint file {tag_dir / f} could not be read back")
        entries[f] = {"bytes": (tag_dir / f).stat().st_size, HASH_ALGORITHM: digests[f]}
    manifest = {"format_version": MANIFEST_VERSION, "algorithm": HASH_ALGORITHM, "files": entries}
    tmp = tag_dir / (MANIFEST_FILE + ".tmp")
    # no fsync: DeepSpeed does not sync its files either, and a manifest lost or ahead of its data
    # after a crash only makes the resume check fail and fall back
    with open(tmp, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    os.replace(tmp, tag_dir / MANIFEST_FILE)
    (tag_dir / SAVING_MARKER).unlink(missing_ok=True)


@dataclass(frozen=True)
class TagStatus:
    """What :func:`check_tag` found: ``state`` is ``complete`` (checksums match), ``unverified``
    (no manifest and no marker: written before checksums were recorded) or ``bad``; ``reason`` says
    why a tag is bad (or unverified)."""

    state: str
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.state in ("complete", "unverified")


def check_tag(tag_dir: Path) -> TagStatus:
    """Whether ``tag_dir`` holds a complete checkpoint: every file its manifest lists is there with
    the recorded size and SHA-256. Collective when distributed (every rank calls it)."""
    if not tag_dir.is_dir():
        return TagStatus("bad", f"{tag_dir} does not exist")
    manifest_path = tag_dir / MANIFEST_FILE
    if not manifest_path.exists():
        if (tag_dir / SAVING_MARKER).exists():
            return TagStatus("bad", f"{tag_dir} is incomplete: its save did not finish")
        if not tag_files(tag_dir):
            return TagStatus("bad", f"{tag_dir} is empty")
        return TagStatus("unverified", f"{tag_dir} has no {MANIFEST_FILE} (an older checkpoint)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = {
            f: (int(e["bytes"]), str(e[manifest["algorithm"]]))
            for f, e in manifest["files"].items()
        }
        if manifest["algorithm"] != HASH_ALGORITHM:
            raise ValueError(f"algorithm {manifest['algorithm']!r}, expected {HASH_ALGORITHM!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return TagStatus("bad", f"{manifest_path} is unreadable ({type(e).__name__}: {e})")
    for f, (size, _) in files.items():  # sizes first: a truncated file costs no hashing
        p = tag_dir / f
        if not p.is_file():
            return TagStatus("bad", f"{p} is missing")
        if p.stat().st_size != size:
            return TagStatus("bad", f"{p} has {p.stat().st_size} bytes, {size} were written")
    digests = hash_files(tag_dir, sorted(files))
    for f, (_, expected) in sorted(files.items()):
        if digests[f] != expected:
            return TagStatus(
                "bad",
                f"{tag_dir / f} does not match its checksum (the file was modified or damaged)",
            )
    return TagStatus("complete")


def is_marked_incomplete(tag_dir: Path) -> bool:
    """The tag's save started and never finished (cheap: no hashing)."""
    return (tag_dir / SAVING_MARKER).exists() and not (tag_dir / MANIFEST_FILE).exists()


# --------------------------------------------------------------------------------------------------
# stale temporaries


@contextlib.contextmanager
def staged_directory(path: str | Path) -> Iterator[Path]:
    """A directory that appears whole or not at all: the block writes into ``.partial-<name>``
    next to ``path`` (the path it is given); when the block ends without an error, that directory
    is renamed to ``path`` (an existing ``path`` is moved aside to ``.partial-<name>.old`` first and
    removed after). A run killed inside the block leaves ``path`` as it was (missing, or the
    previous complete copy) and a ``.partial-`` directory, which :func:`clean_stale_temp_files`
    removes at the next start; a block that raises removes its partial directory itself.
    Rank 0 writes and renames; other ranks get ``path`` (they write nothing in it) and call
    nothing collective here, so the block's own collectives line up on every rank."""
    path = Path(path)
    if not is_main():
        yield path
        return
    parent = path.parent
    tmp, old = parent / f"{PARTIAL_PREFIX}{path.name}", parent / f"{PARTIAL_PREFIX}{path.name}.old"
    with naming_write_errors(path, "model checkpoint"):
        parent.mkdir(parents=True, exist_ok=True)
        for leftover in (tmp, old):
            if leftover.exists():
                shutil.rmtree(leftover)
        tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def clean_stale_temp_files(run_dir: str | Path) -> list[Path]:
    """Delete the temporaries an interrupted save left in a run's output directory (rank 0; returns
    what was removed). Looked at: the run directory itself and its immediate subdirectories (the
    final model, PPO's ``actor/`` and ``critic/``), and everything under ``checkpoints/`` and
    ``train_state/``. Only names an interrupted save produces are touched (``.tmpXXXXXX`` of
    safetensors, ``*.json.tmp``, and the ``.partial-*`` directories of :func:`staged_directory` in
    the run directory and ``checkpoints/``); nothing else in the directory is."""
    run_dir = Path(run_dir)
    if not is_main() or not run_dir.is_dir():
        return []
    removed = []
    # model checkpoints an interrupted save was writing (or replacing): whole directories
    for parent in (run_dir, run_dir / "checkpoints"):
        if not parent.is_dir():
            continue
        for p in parent.iterdir():
            if p.name.startswith(PARTIAL_PREFIX) and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
                removed.append(p)
                log.warning("removed %s, a model checkpoint an interrupted save left unfinished", p)
    candidates: list[Path] = []
    for p in run_dir.iterdir():
        if p.is_dir() and p.name in ("checkpoints", "train_state"):
            candidates += [Path(d, n) for d, _, names in os.walk(p) for n in names]
        elif p.is_dir():
            candidates += [c for c in p.iterdir() if c.is_file()]
        else:
            candidates.append(p)
    for p in candidates:
        if _STALE_TEMP.match(p.name) and p.is_file() and not p.is_symlink():
            size = p.stat().st_size
            p.unlink()
            removed.append(p)
            log.warning(
                "removed %s (%s), a temporary file an interrupted save left behind",
                p,
                _human(size),
            )
    return removed


# --------------------------------------------------------------------------------------------------
# write errors

# What torch's zip writer and C++ streams say when a write fails: the cause is not in the message.
_WRITER_FAILURE = ("iostream error", "PytorchStreamWriter", "inline_container", "file write failed")
_DISK_FULL_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
# A failed write with less than this free on the target's filesystem was the disk filling up.
_FULL_BELOW_BYTES = 16 << 20


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _usage(path: Path) -> tuple[int, int] | None:
    """(free, total) bytes on the filesystem of ``path`` (its nearest existing ancestor)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        u = shutil.disk_usage(p)
    except OSError:
        return None
    return u.free, u.total


def is_disk_full(exc: BaseException, path: Path) -> bool:
    """Whether ``exc``, raised while writing under ``path``, means the disk (or quota) is full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    msg = str(exc)
    if any(t in msg for t in _DISK_FULL_TEXT):
        return True
    if any(t in msg for t in _WRITER_FAILURE):
        usage = _usage(path)
        return usage is not None and usage[0] < _FULL_BELOW_BYTES
    return False


@contextlib.contextmanager
def naming_write_errors(path: str | Path, what: str, then: str = "") -> Iterator[None]:
    """Re-raise a failed write under ``path`` as an error that names it: ``OSError(ENOSPC)`` saying
    "no space left on device" with the free space when the disk is full, otherwise the original
    error's type with the path prepended. ``what`` names the thing written ("model checkpoint");
    ``then`` says what to do beyond freeing space."""
    path = Path(path)
    try:
        yield
    except Exception as e:
        if isinstance(e, OSError | RuntimeError) or type(e).__name__ == "SafetensorError":
            if is_disk_full(e, path):
                usage = _usage(path)
                room = f" ({_human(usage[0])} free of {_human(usage[1])})" if usage else ""
                raise OSError(
                    errno.ENOSPC,
                    f"no space left on device while writing the {what} {path}{room}: free space "
                    f"on that filesystem (or use another --output_dir), then run the same "
                    f"command again. {then}".rstrip(),
                ) from e
            if str(path) not in str(e):
                if isinstance(e, OSError):
                    raise OSError(e.errno, f"writing the {what} {path} failed: {e}") from e
                raise RuntimeError(f"writing the {what} {path} failed: {e}") from e
        raise
