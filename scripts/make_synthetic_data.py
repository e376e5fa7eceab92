"""Regenerate the bundled synthetic TL;DR comparisons (marlhf/data/bundled/synthetic_tldr.jsonl).

    python scripts/make_synthetic_data.py [--train 1900] [--valid 300] [--seed 0] [--out PATH]

The file is deterministic in the arguments; see ``marlhf.data.synthetic`` for the task and the gold
scorer that labelled it. Rows use the real dataset's split names ("train", "valid1").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from marlhf.data.sources import BUNDLED_SYNTHETIC
from marlhf.data.synthetic import generate, gold_score, prompt_of


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=1900, help="train comparisons")
    parser.add_argument("--valid", type=int, default=300, help="validation comparisons")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--out", type=Path, default=BUNDLED_SYNTHETIC, help="output jsonl")
    args = parser.parse_args(argv)
    rows = generate(args.train, args.seed, "train") + generate(
        args.valid, args.seed, "valid1", id_offset=args.train
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    agree = decided = 0
    for row in rows:
        g = [gold_score(prompt_of(row), s["text"]) for s in row["summaries"]]
        if g[0] != g[1]:
            decided += 1
            agree += (g[0] > g[1]) == (row["choice"] == 0)
    print(
        f"wrote {len(rows)} comparisons to {args.out} ({args.out.stat().st_size / 1e6:.2f} MB); "
        f"labels agree with the gold scorer on {agree / max(decided, 1):.1%} of {decided} "
        f"non-tied pairs"
    )


if __name__ == "__main__":
    main()
