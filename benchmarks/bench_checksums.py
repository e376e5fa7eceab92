"""Cost of the training-state checksums (``marlhf.runtime.checkpoint_files``) against writing the state.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_checksums.py            # tiny model, ~30 s
    .venv/bin/python benchmarks/bench_checksums.py --tag out/sft/train_state/model/step-600

``--tag``: a ``train_state/<engine>/step-N`` directory; without it a 3-step SFT run of the tiny model
(``python -m marlhf.stages.sft``, ZeRO-0) makes one in a temporary directory. On a copy of the tag,
the median (and best) over ``--repeats`` of

- ``save``: ``torch.save`` of its state file's content again (what DeepSpeed's checkpoint costs);
- ``finish``: ``finish_tag`` (SHA-256 of every file + the manifest), what each save adds;
- ``check``: ``check_tag`` (sizes + SHA-256 against the manifest), what a resume adds;

then the streaming speed of ``sha256`` and ``blake2b`` (8 MiB chunks, as ``file_digest``) over a
``--mib`` MiB file of random bytes (in the page cache after writing: the hash, not the disk). One
process; with N ranks the files of a tag are shared out between them. The last line is JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from marlhf.runtime.checkpoint_files import check_tag, finish_tag

REPO = Path(__file__).resolve().parents[1]


def _timed(fn, repeats: int) -> tuple[float, float]:
    """(median, best) seconds of ``fn()`` over ``repeats`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def _make_tag(work: Path) -> Path:
    out = work / "sft"
    cmd = [
        sys.executable, "-m", "marlhf.stages.sft", "--model_name_or_path", "tiny",
        "--output_dir", str(out), "--data_output_path", str(work / "cache"), "--max_steps", "3",
        "--per_device_train_batch_size", "4", "--max_seq_len", "192", "--disable_progress_bar",
        "--enable_tensorboard", "false",
    ]  # fmt: skip
    env = dict(os.environ, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    return out / "train_state" / "model" / "step-3"


def _hash_speed(path: Path, algorithm: str) -> float:
    """MB/s of hashing ``path`` in 8 MiB chunks."""
    h = hashlib.new(algorithm)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return path.stat().st_size / (time.perf_counter() - t0) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tag", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tag = args.tag or _make_tag(work)
        copy = work / "tag"
        shutil.copytree(tag, copy)
        files = [p for p in copy.rglob("*") if p.is_file() and p.name != "checksums.json"]
        size = sum(p.stat().st_size for p in files)
        biggest = max(files, key=lambda p: p.stat().st_size)
        state = torch.load(biggest, weights_only=False, map_location="cpu")
        save = _timed(lambda: torch.save(state, work / "resave.pt"), args.repeats)
        finish = _timed(lambda: finish_tag(copy), args.repeats)
        check = _timed(lambda: check_tag(copy), args.repeats)
        assert check_tag(copy).state == "complete"

        big = work / "random.bin"
        with open(big, "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(1 << 20))
        speed = {a: _hash_speed(big, a) for a in ("sha256", "blake2b")}

    print(f"tag {tag}: {len(files)} files, {size / 1e6:.2f} MB")
    print(f"{'':<8}{'median ms':>10}{'best ms':>10}")
    for name, (med, best) in (("save", save), ("finish", finish), ("check", check)):
        print(f"{name:<8}{med * 1e3:>10.1f}{best * 1e3:>10.1f}")
    print(f"finish / save: {finish[0] / save[0]:.2f}")
    for a, mbs in speed.items():
        print(f"{a}: {mbs:.0f} MB/s over {args.mib} MiB")
    print(
        json.dumps(
            {
                "tag_mb": size / 1e6,
                "save_ms": save[0] * 1e3,
                "finish_ms": finish[0] * 1e3,
                "check_ms": check[0] * 1e3,
                **{f"{a}_mb_s": v for a, v in speed.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
