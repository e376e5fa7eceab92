"""Labelled comparisons of a policy's own answers (marlhf.data.policy_comparisons): the labels follow
the Bradley–Terry model on gold, the rows load through the TL;DR adapter, and bad input is named."""

from __future__ import annotations

import json
import math

import pytest

from marlhf.data import policy_comparisons as pc
from marlhf.data.long_tasks import gold_scorer_for
from marlhf.data.schema import DataError
from marlhf.data.sources import bundled_file, load_examples
from marlhf.data.synthetic import BETA, prompt_of


def _task_rows(task: str, split: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in open(bundled_file(task))]
    return [r for r in rows if r["split"] == split]


def _samples(path, rows, which: int, prefix="synthetic-tldr") -> str:
    """An inference output: one answer per post, summary ``which`` of each bundled row."""
    with open(path, "w") as f:
        for r in rows:
            out = {
                "prompt_id": f"{prefix}/{r['info']['id']}",
                "prompt": prompt_of(r),
                "response": r["summaries"][which]["text"],
                "gold": 0.0,
            }
            f.write(json.dumps(out) + "\n")
    return str(path)


def test_labels_follow_bradley_terry_on_gold(tmp_path):
    rows = _task_rows("synthetic-tldr")[:800]
    a, b = _samples(tmp_path / "a.jsonl", rows, 0), _samples(tmp_path / "b.jsonl", rows, 1)
    out, counts = pc.label_pairs("synthetic-tldr", [a, b], seed=3)
    assert counts.pairs == len(out) > 700 and counts.unmatched == 0
    assert counts.pairs + counts.identical + counts.empty == len(rows)
    # the expected number of first-answer wins, summed from gold independently of the labeller
    gold = gold_scorer_for("synthetic-tldr")
    probs = []
    for r in out:
        g0, g1 = (gold(prompt_of(r), s["text"]) for s in r["summaries"])
        probs.append(1 / (1 + math.exp(-BETA * (g0 - g1))))
    wins = sum(r["choice"] == 0 for r in out)
    sd = math.sqrt(sum(p * (1 - p) for p in probs))
    assert abs(wins - sum(probs)) < 4 * sd, (wins, sum(probs), sd)
    # labels agree with the gold order far above chance (the bundled labels: 0.88)
    agree = sum((p > 0.5) == (r["choice"] == 0) for p, r in zip(probs, out, strict=True))
    assert agree / len(out) > 0.8
    for r in out:
        assert r["split"] == "train" and r["batch"] == pc.BATCH
        assert [s["policy"] for s in r["summaries"]] == ["sft", "sft"]
    again, _ = pc.label_pairs("synthetic-tldr", [a, b], seed=3)
    other, _ = pc.label_pairs("synthetic-tldr", [a, b], seed=4)
    assert again == out and [r["choice"] for r in other] != [r["choice"] for r in out]


def test_rows_load_through_the_tldr_adapter(tmp_path):
    rows = _task_rows("synthetic-tldr")[:40]
    a, b = _samples(tmp_path / "a.jsonl", rows, 0), _samples(tmp_path / "b.jsonl", rows, 1)
    assert pc.main(["--samples", a, b, "--output", str(tmp_path / "p" / "pairs.jsonl")]).pairs
    labelled = [json.loads(line) for line in open(tmp_path / "p" / "pairs.jsonl")]
    examples, bad = load_examples(str(tmp_path / "p" / "pairs.jsonl"), "train")
    assert bad == 0 and len(examples) == len(labelled)
    for e, r in zip(examples, labelled, strict=True):
        assert e.prompt == prompt_of(r)
        assert e.chosen.strip() == r["summaries"][r["choice"]]["text"]
        assert e.rejected.strip() == r["summaries"][1 - r["choice"]]["text"]


def test_long_task_answers_are_labelled_with_its_gold(tmp_path):
    rows = _task_rows("synthetic-facts-16")[:30]
    a = _samples(tmp_path / "a.jsonl", rows, 0, prefix="synthetic-facts-16")
    b = _samples(tmp_path / "b.jsonl", rows, 1, prefix="synthetic-facts-16")
    out, counts = pc.label_pairs("synthetic-facts-16", [a, b])
    assert counts.pairs == len(out) > 0
    assert {r["info"]["id"] for r in out} <= {r["info"]["id"] for r in rows}


def test_skips_identical_and_empty_answers_and_counts_unmatched(tmp_path):
    rows = _task_rows("synthetic-tldr")[:6]
    a = _samples(tmp_path / "a.jsonl", rows, 0)
    lines = [json.loads(line) for line in open(a)]
    lines[1]["response"] = "  "  # empty
    lines.pop()  # prompt 6 in a only
    with open(tmp_path / "b.jsonl", "w") as f:
        for i, r in enumerate(lines):
            if i >= 2:
                r = dict(r, response=rows[i]["summaries"][1]["text"])
            f.write(json.dumps(r) + "\n")
    out, counts = pc.label_pairs("synthetic-tldr", [a, str(tmp_path / "b.jsonl")])
    assert (counts.identical, counts.empty, counts.unmatched) == (1, 1, 1)
    assert (
        counts.pairs
        == len(out)
        == 3
        - sum(rows[i]["summaries"][0]["text"] == rows[i]["summaries"][1]["text"] for i in (2, 3, 4))
    )


def _broken(tmp_path, edit) -> str:
    rows = _task_rows("synthetic-tldr")[:3]
    path = _samples(tmp_path / "bad.jsonl", rows, 0)
    lines = open(path).read().splitlines()
    lines[1] = edit(lines[1])
    open(path, "w").write("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s[:-3], "bad.jsonl line 2: not valid JSON"),
        (lambda s: "[1]", "bad.jsonl line 2: expected a JSON object"),
        (lambda s: json.dumps({**json.loads(s), "response": None}), 'line 2: field "response"'),
        (
            lambda s: json.dumps({**json.loads(s), "prompt": "POST\nother\nTL;DR: "}),
            "line 2: field",
        ),
        (
            lambda s: json.dumps({**json.loads(s), "prompt_id": "synthetic-tldr/t3_nope"}),
            "not a post",
        ),
    ],
)
def test_bad_samples_name_file_and_line(tmp_path, edit, message):
    good = _samples(tmp_path / "good.jsonl", _task_rows("synthetic-tldr")[:3], 1)
    with pytest.raises(DataError, match=message):
        pc.label_pairs("synthetic-tldr", [_broken(tmp_path, edit), good])


def test_held_out_prompts_and_repeats_are_refused(tmp_path):
    held = _task_rows("synthetic-tldr", "valid1")[:2]
    a, b = _samples(tmp_path / "a.jsonl", held, 0), _samples(tmp_path / "b.jsonl", held, 1)
    with pytest.raises(DataError, match="held-out post .*--split train"):
        pc.label_pairs("synthetic-tldr", [a, b])
    rows = _task_rows("synthetic-tldr")[:2]
    twice = _samples(tmp_path / "twice.jsonl", [rows[0], rows[1], rows[0]], 0)
    with pytest.raises(DataError, match="twice.jsonl line 3: prompt .* again .*line 1"):
        pc.label_pairs("synthetic-tldr", [twice, b])


def test_cli_refuses_no_pairs_and_other_tasks(tmp_path):
    rows = _task_rows("synthetic-tldr")[:3]
    a = _samples(tmp_path / "a.jsonl", rows, 0)
    out = tmp_path / "pairs.jsonl"
    with pytest.raises(SystemExit, match="no pair of different answers"):
        pc.main(["--samples", a, a, "--output", str(out)])
    assert not out.exists()
    other = _samples(tmp_path / "other.jsonl", _task_rows("synthetic-tldr")[3:6], 1)
    with pytest.raises(SystemExit, match="answer different prompts .*--num-samples 0"):
        pc.main(["--samples", a, other, "--output", str(out)])
    with pytest.raises(SystemExit, match="not a synthetic task"):
        pc.main(
            ["--task", "openai/summarize_from_feedback", "--samples", a, a, "--output", str(out)]
        )
