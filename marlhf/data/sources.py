"""Where a ``--data_path`` entry's examples come from: the spec (``name``, ``adapter:path`` or a
local path), the bundled and generated synthetic files, local files and directories (split by file
name, else a fixed 95/5 train/eval carve), reasoning-gym's generators (``reasoning-gym:NAME``,
`marlhf.data.gym`), or the hub; each row through its adapter
(:mod:`marlhf.data.adapters`) into :class:`~marlhf.data.schema.Example` records, with counts of
what was read, skipped and kept.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from marlhf.data.adapters import (
    _DETECT,
    _TLDR_COLS,
    ADAPTERS,
    ALIASES,
    Adapter,
    detect_adapter,
    get_adapter,
    log,
    rename_columns,
    schema_help,
)
from marlhf.data.gym import gym_examples, is_gym_spec
from marlhf.data.long_tasks import TASKS as LONG_TASKS
from marlhf.data.long_tasks import data_file as long_task_file
from marlhf.data.readers import LOCAL_SUFFIXES, RawRows, _read_csv, _read_local
from marlhf.data.reasoning_tasks import TASKS as ARITH_TASKS
from marlhf.data.reasoning_tasks import data_file as arith_task_file
from marlhf.data.report import SourceCounts
from marlhf.data.schema import DataError, Example

BUNDLED_SYNTHETIC = Path(__file__).resolve().parent / "bundled" / "synthetic_tldr.jsonl"


EVAL_CARVE_SEED = 1234  # fixed: the 95/5 carve must not move with the training seed


EVAL_CARVE_FRACTION = 0.05


_SPLIT_NAMES = {
    "train": ("train",),
    "eval": ("validation", "valid", "eval", "dev", "test"),
}


def _split_files(directory: Path, split: str) -> list[Path]:
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    return [p for p in files if p.name.lower().startswith(_SPLIT_NAMES[split])]


def carve(n: int, split: str) -> np.ndarray:
    """Deterministic 95/5 train/eval carve of ``n`` rows for datasets with only a train split."""
    perm = np.random.RandomState(EVAL_CARVE_SEED).permutation(n)
    n_eval = _n_eval(n)
    return np.sort(perm[:n_eval] if split == "eval" else perm[n_eval:])


def _n_eval(n: int) -> int:
    return int(round(n * EVAL_CARVE_FRACTION))


def carve_min_rows() -> int:
    """The fewest rows whose 95/5 carve gives the eval split one row (11: round() halves to even)."""
    n = 1
    while _n_eval(n) == 0:
        n += 1
    return n


def parse_spec(spec: str) -> tuple[Adapter | None, str | None]:
    """``data_path`` entry -> (forced or registered adapter, local path or None for hub/bundled);
    (None, None) for a reasoning-gym task (`marlhf.data.gym`)."""
    if is_gym_spec(spec) and not Path(spec).exists():
        return None, None
    if ":" in spec and not Path(spec).exists():
        head, rest = spec.split(":", 1)
        if ALIASES.get(head, head) in ADAPTERS:
            return get_adapter(head), rest
    if Path(spec).exists():
        return None, spec
    return get_adapter(spec), None


def peek_columns(path: Path, max_rows: int = 200) -> frozenset[str] | None:
    """The columns of the first rows of a local data file, or of a directory's first train file
    (None: no file to read, or rows that do not parse: the stage reports those by line)."""
    if path.is_dir():
        files = _split_files(path, "train")
        if not files:
            return None
        path = files[0]
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return frozenset(pq.read_schema(path).names)
        if path.suffix in (".csv", ".tsv"):
            return _read_csv(path, skip_bad_rows=True).columns
        if path.suffix == ".json" and path.read_text(errors="replace").lstrip().startswith("["):
            rows = json.loads(path.read_text())[:max_rows]
        else:
            with open(path, encoding="utf-8-sig", errors="replace") as f:
                lines = [ln for ln in (next(f, "") for _ in range(max_rows)) if ln.strip()]
            rows = [json.loads(ln) for ln in lines]
    except (OSError, ValueError, ImportError):
        return None
    return frozenset(k for r in rows if isinstance(r, dict) for k in r)


def columns_problem(spec: str, mapping: dict[str, str] | None = None) -> str | None:
    """Why a local ``--data_path`` entry's columns (renamed by ``mapping``, ``{theirs: ours}``)
    fit no schema (or not the adapter it forces), listing the schemas; None when they fit or
    cannot be read here."""
    adapter, local = parse_spec(spec)
    if local is None:
        return None
    cols = peek_columns(Path(local))
    if not cols:
        return None
    cols = frozenset((mapping or {}).get(c, c) for c in cols)
    if adapter is None:
        if any(ADAPTERS[name].columns <= cols for name in _DETECT):
            return None
        return f"--data_path {schema_help(cols, spec)}"
    if adapter.columns <= cols:
        return None
    missing = ", ".join(sorted(adapter.columns - cols))
    return (
        f"--data_path {spec}: the {adapter.name} adapter needs the columns {missing}, not in "
        f"{sorted(cols)}; map them with --data_columns (e.g. --data_columns prompt=query)"
    )


def _convert_rows(
    adapter: Adapter | None,
    raw: RawRows,
    source: str,
    keep: np.ndarray | None,
    skip_bad_rows: bool,
    options: dict,
    max_samples: int,
    split_filter: Callable[[dict], bool] | None = None,
    counts: SourceCounts | None = None,
) -> tuple[list[Example], int]:
    """The examples of ``raw``'s rows in the split (``keep`` / ``split_filter``); ``counts`` (when
    given) adds the rows of the split, the bad and by-design skips and the examples."""
    counts = counts if counts is not None else SourceCounts(source)
    n_bad = len(raw.bad)
    for msg in raw.bad:
        log.debug("skipped: %s", msg)
    out: list[Example] = []
    if adapter is None and len(raw.rows) > 0:  # no rows: no schema to tell, nothing to convert
        adapter = detect_adapter(raw.columns, source)
    opts = dict(options, columns=raw.columns, text_cells=raw.text_cells)
    wanted = None if keep is None else set(keep.tolist())
    for i, row in enumerate(raw.rows):
        if wanted is not None and i not in wanted:
            continue
        if split_filter is not None and not split_filter(row):
            continue
        counts.in_split += 1
        try:
            ex = adapter.to_example(row, raw.label(i), opts)
        except DataError as e:
            if not skip_bad_rows:
                raise
            n_bad += 1
            log.debug("skipped: %s", e)
            continue
        if ex is None:
            counts.by_design += 1
            continue
        out.append(ex)
        if max_samples and len(out) >= max_samples:
            counts.capped = True
            break
    counts.bad += n_bad
    counts.examples += len(out)
    if n_bad:
        log.warning("%s: skipped %d bad rows", source, n_bad)
    return out, n_bad


def _row_split(row: dict) -> str | None:
    value = row.get("split") if isinstance(row, dict) else None
    if not isinstance(value, str):
        return None
    if value.startswith("train"):
        return "train"
    if value.startswith(_SPLIT_NAMES["eval"]):
        return "eval"
    return None


def bundled_file(adapter_name: str) -> Path | None:
    """The file shipped with the package for a synthetic task (``synthetic-tldr``), or generated
    for one (``synthetic-facts-*``, ``synthetic-verdict-*``; a directory of a train and a valid file
    for ``synthetic-arith-*``); None for the hub datasets."""
    if adapter_name == "synthetic-tldr":
        return BUNDLED_SYNTHETIC
    if adapter_name in LONG_TASKS:
        return long_task_file(adapter_name)
    if adapter_name in ARITH_TASKS:
        return arith_task_file(adapter_name)
    return None


def load_examples(
    spec: str,
    split: str,
    *,
    skip_bad_rows: bool = False,
    max_samples: int = 0,
    webgpt_skip_ties: bool = False,
    counts: SourceCounts | None = None,
    columns: dict[str, str] | None = None,
) -> tuple[list[Example], int]:
    """All ``Example``s of one ``data_path`` entry's ``split`` ("train" or "eval"), in file order,
    and the number of bad rows skipped (always 0 unless ``skip_bad_rows``). ``counts``, when given,
    receives the files read and how many rows each step kept (see ``marlhf.data.report``).
    ``columns`` (``{their name: ours}``, ``--data_columns``) renames a local file's columns first."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    counts = counts if counts is not None else SourceCounts(spec)
    if is_gym_spec(spec):  # generated by reasoning-gym: no file, no bad rows
        return gym_examples(spec, split, max_samples, counts), 0
    opts = {"webgpt_skip_ties": webgpt_skip_ties, "rename": dict(columns or {})}
    adapter, local = parse_spec(spec)
    if local is None and adapter is not None:
        bundled = bundled_file(adapter.name)
        local = None if bundled is None else str(bundled)
    if local is None:
        return _load_hub(adapter, split, skip_bad_rows, max_samples, opts, counts)
    path = Path(local)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    files, carve_split = [path], None
    if path.is_dir():
        if not _split_files(path, "train"):
            raise DataError(f"{path}: no train files (names starting with 'train')")
        # Only train files: carve a deterministic 95/5 train/eval split from them (like WebGPT).
        carve_split = not _split_files(path, "eval")
        files = _split_files(path, "train" if carve_split else split)
    return _load_files(adapter, files, split, carve_split, skip_bad_rows, max_samples, opts, counts)


def _load_files(
    adapter: Adapter | None,
    files: list[Path],
    split: str,
    carve_split: bool | None,
    skip_bad_rows: bool,
    max_samples: int,
    options: dict,
    counts: SourceCounts,
) -> tuple[list[Example], int]:
    """``carve_split``: True carve 95/5, False take all rows, None decide from the rows (single file)."""
    examples: list[Example] = []
    n_bad = 0
    for f in files:
        raw = _read_local(f, skip_bad_rows)
        if options.get("rename"):
            rows = rename_columns(list(raw.rows), options["rename"])
            names = frozenset(options["rename"].get(c, c) for c in raw.columns)
            raw = dataclasses.replace(raw, rows=rows, columns=names)
        counts.files.append(str(f))
        counts.rows_read += len(raw.rows) + len(raw.bad)
        split_filter = None
        keep = None
        mode = carve_split
        if mode is None:
            has_split = "split" in raw.columns and (
                adapter is None or adapter.columns == _TLDR_COLS
            )
            mode = not has_split
            if has_split:
                split_filter = lambda row: _row_split(row) == split  # noqa: E731
        if mode:
            rows = list(raw.rows)
            raw = dataclasses.replace(raw, rows=rows)
            keep = carve(len(rows), split)
            counts.carve_min_rows = carve_min_rows()
        cap = max_samples - len(examples) if max_samples else 0
        exs, bad = _convert_rows(
            adapter, raw, str(f), keep, skip_bad_rows, options, cap, split_filter, counts
        )
        examples += exs
        n_bad += bad
        if max_samples and len(examples) >= max_samples:
            break
    return examples, n_bad


def _load_hub(
    adapter: Adapter,
    split: str,
    skip_bad_rows: bool,
    max_samples: int,
    options: dict,
    counts: SourceCounts,
) -> tuple[list[Example], int]:
    import datasets

    hub_split = adapter.splits[split]
    source = f"{adapter.hub_id}[{hub_split or 'train'}]"
    try:
        if adapter.hub_files:
            url = f"hf://datasets/{adapter.hub_id}/{adapter.hub_files[hub_split or 'train']}"
            ds = datasets.load_dataset("json", data_files=url, split="train")
        else:
            ds = datasets.load_dataset(
                adapter.hub_id, adapter.hub_config, split=hub_split or "train"
            )
    except Exception as e:  # noqa: BLE001
        raise DataError(
            f"{adapter.hub_id}: cannot load from the hub ({type(e).__name__}: {e}); "
            "download it elsewhere and pass the local files instead"
        ) from e
    counts.files.append(source)
    counts.rows_read += len(ds)
    keep = None
    if hub_split is None:
        keep = carve(len(ds), split)
        counts.carve_min_rows = carve_min_rows()
    raw = RawRows(ds, lambda i: f"{source} row {i + 1}", frozenset(ds.column_names), [])
    return _convert_rows(
        adapter, raw, source, keep, skip_bad_rows, options, max_samples, None, counts
    )


def iter_examples(
    specs: Iterable[str], split: str, **kw
) -> Iterator[tuple[str, list[Example], int]]:
    """``(spec, examples, n_bad)`` for each ``data_path`` entry."""
    for spec in specs:
        exs, n_bad = load_examples(spec, split, **kw)
        yield spec, exs, n_bad
