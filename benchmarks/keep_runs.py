"""Keep the finished runs of a credit comparison small enough to commit, and bring them back.

A comparison's run directory holds its actor, critic, optimizer state and logs (about 17 MB); what
its tables read is ``metrics.jsonl`` (the per-step keys of :func:`benchmarks.analysis.load_run`)
and ``eval.json`` (the held-out figures). A comparison whose runs do not fit one sitting (the
reasoning comparison on 2 cores) keeps those two files of every finished run:

    python benchmarks/keep_runs.py output/reasoning_credit benchmarks/runs/reasoning_credit

and the same command the other way round puts them back (``--restore``), after which the
comparison's command skips them (a run with ``eval.json`` is finished) and its tables read them
as they read the originals. Steps are kept once each (the last row of a step, as ``load_run``
reads them), with the keys ``load_run`` reads and nothing else, their values to 6 significant
digits (the tables print 3 decimals): about 43 KB a run of 200 steps, 5 KB compressed as git
stores it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.analysis import METRIC_KEYS, last_rows  # noqa: E402

KEPT = ("metrics.jsonl", "eval.json")


def keep_run(run: Path, dest: Path) -> None:
    """Write ``run``'s per-step metrics (the read keys, one row a step) and its ``eval.json`` into
    ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    keys = ("step", *METRIC_KEYS.values())
    rows = [{k: _short(r[k]) for k in keys if k in r} for r in last_rows(run / "metrics.jsonl")]
    tmp = dest / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(dest / "metrics.jsonl")
    shutil.copyfile(run / "eval.json", dest / "eval.json")


def _short(value):
    """A float to 6 significant digits; anything else as it is."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def keep_runs(src: Path, dest: Path) -> list[Path]:
    """Keep every finished run under ``src`` (a directory with ``eval.json`` and
    ``metrics.jsonl``) at the same relative place under ``dest``; returns the runs kept."""
    runs = sorted(p.parent for p in src.rglob("eval.json") if (p.parent / "metrics.jsonl").exists())
    for run in runs:
        keep_run(run, dest / run.relative_to(src))
    return runs


def restore_runs(kept: Path, out: Path) -> list[Path]:
    """Copy the kept runs under ``kept`` into ``out`` (a comparison's ``--output_dir``), leaving
    alone any run ``out`` already has finished; returns the runs copied."""
    copied = []
    for eval_file in sorted(kept.rglob("eval.json")):
        rel = eval_file.parent.relative_to(kept)
        if (out / rel / "eval.json").exists():
            continue
        (out / rel).mkdir(parents=True, exist_ok=True)
        # metrics first: a run counts as finished once its eval.json is there
        for name in KEPT:
            shutil.copyfile(kept / rel / name, out / rel / name)
        copied.append(out / rel)
    return copied


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "src", type=Path, help="a comparison's --output_dir (with --restore: the kept runs)"
    )
    p.add_argument(
        "dest", type=Path, help="where the kept runs go (with --restore: the --output_dir)"
    )
    p.add_argument("--restore", action="store_true", help="put kept runs back into an --output_dir")
    args = p.parse_args(argv)
    if not args.src.is_dir():
        p.error(f"{args.src}: no such directory")
    if args.restore:
        done = restore_runs(args.src, args.dest)
        print(f"[keep_runs] {len(done)} runs restored into {args.dest}")
    else:
        done = keep_runs(args.src, args.dest)
        print(f"[keep_runs] {len(done)} finished runs kept in {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
