"""Choose the evaluation subset of a result file (``evaluation/tools/sample_from_dataset.py``).

The choice depends **only on the set of prompts and the seed** — not on responses, rewards or line
order — so the result files of two models over the same prompts give the same subset, and judging can
pair them. Prompts are deduplicated (first row per prompt kept) and sorted before any random draw.

``--dataset`` takes the dataset names every tool shares (:mod:`marlhf.data.names`, aliases included):

- ``summarize`` (``tldr``): stratified by subreddit (``subreddit`` key, else ``Subreddit: r/NAME`` in the prompt,
  case-insensitive). Subreddits are visited in a seeded random order, round-robin, one prompt per
  subreddit per round for up to ``per_group`` (5) rounds, until ``num`` prompts are chosen; if fewer,
  the rest is topped up at random from the unchosen prompts.
- the others (``hh-rlhf``, ``webgpt``, ``apps``, ``synthetic``): ``num`` prompts uniformly at random.

>>> rows = [{"prompt": f"SUBREDDIT: r/{s}\\npost {i}", "response": "x"}
...         for s in ("cats", "dogs") for i in range(8)]
>>> picked = sample_records(rows, "summarize", num=6, seed=0)
>>> sorted(subreddit_of(r) for r in picked)
['cats', 'cats', 'cats', 'dogs', 'dogs', 'dogs']
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marlhf.cli import parse_config
from marlhf.config import flag
from marlhf.data.names import DATASETS, canonical, names_help
from marlhf.judge.pairing import PairingError, load_results

_SUBREDDIT = re.compile(r"subreddit:\s*r/([A-Za-z0-9_]+)", re.I)


@dataclass
class SampleConfig:
    """Sample the evaluation subset of an inference result file."""

    data_path: str = flag(help="Result JSONL to sample from.", aliases=("--data-path",))
    save_path: str = flag(help="Where to write the sample.", aliases=("--save-path",))
    dataset: str = flag(
        "summarize",
        f"One of {names_help()}: summarize is stratified by subreddit, the others drawn uniformly.",
    )
    num: int = flag(50, "Number of prompts to keep.")
    seed: int = flag(42, "Seed of the draw.")
    per_group: int = flag(
        5, "summarize: at most this many per subreddit before topping up.", aliases=("--per-group",)
    )

    def __post_init__(self) -> None:
        if self.num < 1:
            raise ValueError(f"--num must be >= 1, got {self.num}")
        if self.per_group < 1:
            raise ValueError(f"--per_group must be >= 1, got {self.per_group}")
        if canonical(self.dataset) not in DATASETS:
            raise ValueError(f"--dataset must be one of: {names_help()}; got {self.dataset!r}")


@dataclass
class SampleStage:
    """Choose the same evaluation prompts from result files (by prompt set and seed only)."""

    sample: SampleConfig


def subreddit_of(row: dict[str, Any]) -> str | None:
    """The row's subreddit: the ``subreddit`` key (a leading ``r/`` dropped) or parsed from the prompt."""
    sub = row.get("subreddit")
    if isinstance(sub, str) and sub.strip():
        s = sub.strip()
        return s[2:] if s.lower().startswith("r/") else s
    m = _SUBREDDIT.search(row.get("prompt", ""))
    return m.group(1) if m else None


def sample_prompts(
    prompts_with_group: dict[str, str | None], dataset: str, num: int, seed: int, per_group: int = 5
) -> list[str]:
    """Chosen prompts in selection order, from ``{prompt: subreddit or None}`` (module doc)."""
    rng = random.Random(seed)
    prompts = sorted(prompts_with_group)
    if canonical(dataset) != "summarize":
        rng.shuffle(prompts)
        return prompts[:num]
    groups: dict[str, list[str]] = {}
    for p in prompts:
        groups.setdefault(prompts_with_group[p] or "", []).append(p)
    names = sorted(groups)
    rng.shuffle(names)
    for name in names:
        rng.shuffle(groups[name])
    chosen: list[str] = []
    for r in range(per_group):
        for name in names:
            if len(chosen) == num:
                break
            if r < len(groups[name]):
                chosen.append(groups[name][r])
    if len(chosen) < num:
        taken = set(chosen)
        rest = [p for p in prompts if p not in taken]
        rng.shuffle(rest)
        chosen.extend(rest[: num - len(chosen)])
    return chosen


def sample_records(
    rows: Sequence[dict[str, Any]], dataset: str, num: int = 50, seed: int = 42, per_group: int = 5
) -> list[dict[str, Any]]:
    """The sampled rows (first row of each chosen prompt), in selection order."""
    first: dict[str, dict[str, Any]] = {}
    for row in rows:
        first.setdefault(row["prompt"], row)
    chosen = sample_prompts(
        {p: subreddit_of(r) for p, r in first.items()}, dataset, num, seed, per_group
    )
    return [first[p] for p in chosen]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point of ``evaluation/tools/sample_from_dataset.py``."""

    cfg = parse_config(SampleStage, argv).sample
    try:
        rows = load_results(cfg.data_path)
    except PairingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for r in rows:
        r.pop("_line", None)
    picked = sample_records(rows, cfg.dataset, cfg.num, cfg.seed, cfg.per_group)
    n_unique = len({r["prompt"] for r in rows})
    if len(picked) < cfg.num:
        print(
            f"note: only {n_unique} distinct prompts in {cfg.data_path}; kept all", file=sys.stderr
        )
    save = Path(cfg.save_path)
    save.parent.mkdir(parents=True, exist_ok=True)
    save.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked), encoding="utf-8"
    )
    meta = {
        "source": cfg.data_path,
        "dataset": cfg.dataset,
        "num": cfg.num,
        "seed": cfg.seed,
        "per_group": cfg.per_group,
        "selected": len(picked),
        "distinct_prompts": n_unique,
    }
    src_meta = Path(cfg.data_path + ".meta.json")
    if src_meta.exists():
        try:
            meta["source_meta"] = json.loads(src_meta.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            pass
    Path(str(save) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    groups = {}
    for r in picked:
        g = subreddit_of(r) or "-"
        groups[g] = groups.get(g, 0) + 1
    print(f"wrote {len(picked)} of {n_unique} prompts to {save}", file=sys.stderr)
    if canonical(cfg.dataset) == "summarize":
        print(f"per subreddit: {dict(sorted(groups.items()))}", file=sys.stderr)
    return 0
