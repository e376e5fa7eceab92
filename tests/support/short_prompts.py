"""The bundled TL;DR data with each post cut to its first 1 to 6 sentences (row i keeps 1 + i mod 6):
prompts of 30 to 90 tiny-tokenizer tokens instead of 90 to 150, so that in a batch short rows share
a packed bin with long ones (``marlhf.models.packing``). Pass it as ``--data_path
synthetic-tldr:<path>``."""

from __future__ import annotations

import json
from pathlib import Path

from marlhf.data.sources import BUNDLED_SYNTHETIC


def write_short_tldr(path: Path) -> Path:
    """Write the cut data to ``path`` (once) and return it."""
    if not path.exists():
        rows = [json.loads(line) for line in BUNDLED_SYNTHETIC.read_text().splitlines() if line]
        for i, row in enumerate(rows):
            sentences = row["info"]["post"].split(". ")
            row["info"]["post"] = ". ".join(sentences[: 1 + i % 6])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
