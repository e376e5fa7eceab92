import doctest
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import marlhf.judge.sampling as sampling_mod
from marlhf.judge.sampling import SampleConfig, sample_records, subreddit_of

ROOT = Path(__file__).resolve().parents[2]


def tldr_rows(subs, per_sub, tag="x"):
    return [
        {
            "prompt": f"SUBREDDIT: r/{s}\nTITLE: t{i}\nPOST: post {s} {i}\nTL;DR:",
            "response": f"{tag} {s} {i}",
        }
        for s in subs
        for i in range(per_sub)
    ]


def test_doctests():
    assert doctest.testmod(sampling_mod).failed == 0


def test_subreddit_sources():
    assert subreddit_of({"prompt": "Subreddit: r/AskReddit\nPOST: hi"}) == "AskReddit"
    assert subreddit_of({"prompt": "SUBREDDIT: r/relationship_advice\n"}) == "relationship_advice"
    assert subreddit_of({"prompt": "no header", "subreddit": "r/pets"}) == "pets"
    assert subreddit_of({"prompt": "no header"}) is None


def test_stratified_many_subreddits():
    subs = [f"sub{k}" for k in range(12)]
    picked = sample_records(tldr_rows(subs, 8), "summarize", num=50, seed=42)
    assert len(picked) == 50 and len({r["prompt"] for r in picked}) == 50
    per = Counter(subreddit_of(r) for r in picked)
    # 12 subreddits, round-robin: 4 full rounds (48) + 2 from the fifth round
    assert set(per) == set(subs) and max(per.values()) == 5 and min(per.values()) == 4
    assert sorted(per.values()).count(5) == 2


def test_few_subreddits_topped_up():
    picked = sample_records(tldr_rows(["a", "b", "c"], 30), "summarize", num=50, seed=42)
    per = Counter(subreddit_of(r) for r in picked)
    assert len(picked) == 50 and sum(per.values()) == 50 and min(per.values()) >= 5
    # the first 15 (3 subreddits x 5) are the stratified part
    assert Counter(subreddit_of(r) for r in picked[:15]) == {"a": 5, "b": 5, "c": 5}


def test_small_subreddit_contributes_all_it_has():
    rows = tldr_rows(["big"], 40) + tldr_rows(["tiny"], 2)
    picked = sample_records(rows, "summarize", num=10, seed=0)
    assert Counter(subreddit_of(r) for r in picked[:7]) == {"big": 5, "tiny": 2}


def test_deterministic_by_prompt_across_models_and_file_order():
    rows_a = tldr_rows([f"s{k}" for k in range(15)], 6, tag="model-a")
    rows_b = tldr_rows([f"s{k}" for k in range(15)], 6, tag="model-b")
    random.Random(3).shuffle(rows_b)
    for dataset in ("summarize", "hh-rlhf"):
        pa = [r["prompt"] for r in sample_records(rows_a, dataset, num=50, seed=42)]
        pb = [r["prompt"] for r in sample_records(rows_b, dataset, num=50, seed=42)]
        assert pa == pb
        other = [r["prompt"] for r in sample_records(rows_a, dataset, num=50, seed=43)]
        assert other != pa


def test_random_for_other_datasets_and_duplicates():
    rows = [{"prompt": f"Human: q{i}\n\nAssistant:", "response": "r"} for i in range(30)]
    rows += [{"prompt": "Human: q0\n\nAssistant:", "response": "second sample"}]
    picked = sample_records(rows, "hh-rlhf", num=50, seed=42)
    assert len(picked) == 30  # all distinct prompts, first row of each
    assert all(r["response"] == "r" for r in picked)
    assert len(sample_records(rows, "webgpt", num=7, seed=1)) == 7


def test_config_validation():
    with pytest.raises(ValueError, match="--num"):
        SampleConfig(data_path="a", save_path="b", num=0)


def test_script_readme_command(tmp_path):
    rows = tldr_rows([f"s{k}" for k in range(20)], 4)
    src = tmp_path / "model.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path(str(src) + ".meta.json").write_text(json.dumps({"temperature": 0.8}))
    shuffled = tmp_path / "model-shuffled.jsonl"
    random.Random(0).shuffle(rows)
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = []
    for data, name in ((src, "s1.jsonl"), (shuffled, "s2.jsonl")):
        save = tmp_path / "sub" / name
        p = subprocess.run(
            [
                sys.executable,
                str(ROOT / "evaluation" / "tools" / "sample_from_dataset.py"),
                "--data-path",
                str(data),
                "--save-path",
                str(save),
                "--dataset",
                "summarize",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        outs.append([json.loads(x)["prompt"] for x in save.read_text().splitlines()])
    assert len(outs[0]) == 50 and outs[0] == outs[1]
    meta = json.loads((tmp_path / "sub" / "s1.jsonl.meta.json").read_text())
    assert meta["seed"] == 42 and meta["source_meta"] == {"temperature": 0.8}
