"""Comparisons of a policy's own answers, labelled like a synthetic task's bundled comparisons.

Real RLHF data labels pairs of the SFT policy's own answers (Stiennon et al., 2020): a reward model
trained only on other writers' summaries misjudges the kinds of errors the policy makes, and PPO
finds those errors. For the synthetic tasks the labeller is simulated exactly as it was for the
bundled files: one Bradley–Terry draw on the gold difference per pair
(:func:`marlhf.data.synthetic.labelled_comparison`); the gold score itself is never written as a
target.

The answers come from two runs of the inference program on the task's **train** prompts with
different sampling seeds (held-out prompts are refused, so the evaluation stays clean; with
``--num-samples N`` pass one ``--prompt-seed`` to both, since by default the seed also draws which
prompts are taken)::

    python inference/inference_with_rewards.py --dataset synthetic --model SFT --split train \\
        --num-samples 0 --temperature 1.0 --seed 1 --output a.jsonl     # and --seed 2 -> b.jsonl
    python -m marlhf.data.policy_comparisons --samples a.jsonl b.jsonl --output pairs.jsonl

``pairs.jsonl`` is in the TL;DR comparisons schema (one row per prompt whose two answers differ and
are not empty), so the reward-model stage reads it next to the bundled data:
``--data_path synthetic-tldr pairs.jsonl``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from marlhf.cli import Parser
from marlhf.data.long_tasks import gold_scorer_for
from marlhf.data.readers import json_lines
from marlhf.data.schema import DataError
from marlhf.data.sources import bundled_file, parse_spec
from marlhf.data.synthetic import labelled_comparison, prompt_of

BATCH = "policy-samples"
# How the answers to label are sampled (the demo and the horizon sweep): one inference run per seed
# over all train prompts, at temperature 1 as PPO samples its rollouts.
SAMPLE_SEEDS = (1, 2)
SAMPLE_TEMPERATURE = 1.0


@dataclass
class PairCounts:
    """What became of the prompts the two sample files share."""

    pairs: int = 0
    identical: int = 0  # both answers the same text: nothing to compare
    empty: int = 0  # an empty answer (the schema refuses empty summaries)
    unmatched: int = 0  # prompts sampled in one file only


def read_samples(path: str | Path) -> dict[str, tuple[int, dict]]:
    """An inference output file: ``prompt_id -> (line, row)``; DataError names the file and line
    of a row that is not JSON, lacks ``prompt_id``/``prompt``/``response`` or repeats a prompt."""
    out: dict[str, tuple[int, dict]] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, row in json_lines(f, path):
            if not isinstance(row, dict):
                raise DataError(f"{path} line {line_no}: expected a JSON object")
            for field in ("prompt_id", "prompt", "response"):
                if not isinstance(row.get(field), str):
                    raise DataError(f'{path} line {line_no}: field "{field}" missing or not text')
            if row["prompt_id"] in out:
                first = out[row["prompt_id"]][0]
                raise DataError(
                    f"{path} line {line_no}: prompt {row['prompt_id']} again (first on line {first})"
                )
            out[row["prompt_id"]] = (line_no, row)
    return out


def _task_rows(task: str) -> dict[str, dict]:
    """``info.id -> row`` of the synthetic task's comparisons file (bundled or ``name:path``)."""
    adapter, local = parse_spec(task)
    path = Path(local) if local else (bundled_file(adapter.name) if adapter else None)
    if path is None:
        raise ValueError(
            f"--task {task}: not a synthetic task (its posts and gold scorer are needed)"
        )
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rows[row["info"]["id"]] = row
    return rows


def _checked(
    rows: dict[str, tuple[int, dict]], path: str | Path, task: str, source: dict[str, dict]
) -> dict[str, tuple[int, dict]]:
    """``rows`` after checking that each answers a train post of ``task`` with its exact prompt."""
    for pid, (line, row) in rows.items():
        src = source.get(pid.split("/", 1)[-1])
        where = f"{path} line {line}"
        if src is None:
            raise DataError(f"{where}: prompt {pid} is not a post of {task}")
        if src["split"] != "train":
            raise DataError(
                f"{where}: prompt {pid} is a held-out post ({src['split']}); sample the train "
                "split (--split train), so the evaluation prompts stay unseen"
            )
        if row["prompt"] != prompt_of(src):
            raise DataError(f'{where}: field "prompt" is not {task}\'s prompt for {pid}')
    return rows


def label_pairs(
    task: str,
    samples: Sequence[str | Path],
    seed: int = 1,
    policy: str = "sft",
) -> tuple[list[dict], PairCounts]:
    """Comparisons rows of the answers of ``samples[0]`` and ``samples[1]`` to the same train
    prompts, in prompt-id order, labelled by Bradley–Terry draws on ``task``'s gold score."""
    if len(samples) != 2:
        raise ValueError(f"--samples: two files of answers are compared, got {len(samples)}")
    score = gold_scorer_for(task)
    if score is None:
        raise ValueError(f"--task {task}: not a synthetic task (no gold score to label with)")
    source = _task_rows(task)
    a, b = (_checked(read_samples(p), p, task, source) for p in samples)
    counts = PairCounts(unmatched=len(a.keys() ^ b.keys()))
    rng = random.Random(f"policy-comparisons/{seed}")
    rows = []
    for pid in sorted(a.keys() & b.keys()):
        texts = [a[pid][1]["response"].strip(), b[pid][1]["response"].strip()]
        if not all(texts):
            counts.empty += 1
        elif texts[0] == texts[1]:
            counts.identical += 1
        else:
            info = source[pid.split("/", 1)[-1]]["info"]
            rows.append(labelled_comparison(info, texts, [policy] * 2, BATCH, "train", score, rng))
    counts.pairs = len(rows)
    return rows, counts


def write_rows(rows: list[dict], output: str | Path) -> None:
    """Write JSON lines through a temporary file, so an interrupted run leaves no half file."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, output)


def main(argv: Sequence[str] | None = None) -> PairCounts:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--task", default="synthetic-tldr", help="the synthetic task the answers are for"
    )
    ap.add_argument(
        "--samples", nargs=2, required=True, help="two inference outputs (train prompts)"
    )
    ap.add_argument("--output", required=True, help="comparisons .jsonl to write")
    ap.add_argument("--seed", type=int, default=1, help="seed of the labeller's draws")
    ap.add_argument("--policy", default="sft", help="policy name written to each summary")
    args = ap.parse_args(argv)
    try:
        rows, counts = label_pairs(args.task, args.samples, args.seed, args.policy)
    except (DataError, ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    if not rows:
        hint = ""
        if counts.unmatched:
            hint = (
                "; the files answer different prompts (sample with --num-samples 0, or pass both "
                "runs one --prompt-seed)"
            )
        raise SystemExit(
            f"error: {args.samples}: no pair of different answers to label ({counts}){hint}"
        )
    write_rows(rows, args.output)
    print(
        f"{args.output}: {counts.pairs} labelled pairs ({counts.identical} identical and "
        f"{counts.empty} with an empty answer skipped, {counts.unmatched} prompts in one file only)"
    )
    return counts


if __name__ == "__main__":
    main()
