import doctest
import json
import statistics

import pytest

import marlhf.data.synthetic as S
from marlhf.data.sources import BUNDLED_SYNTHETIC

PROMPT = (
    "POST\nSubreddit: r/family\nLast week, my sister borrowed my car. Sorry for the long post. "
    "I found out that my uncle cancelled the party. I am thirty years old. Then my grandma lost "
    "my keys.\nTL;DR: "
)
COMPLETE = "my sister borrowed my car, my uncle cancelled the party and my grandma lost my keys"
MISSING = "my sister borrowed my car and my uncle cancelled the party"
HALLUCINATING = "my sister borrowed my car, my uncle sold the party and my grandma lost my keys"
GARBAGE = "qwerty zzz lorem ipsum blah blah"
VERBOSE = COMPLETE + " and i am thirty years old and sorry for the long post basically"
RAMBLING = COMPLETE + " and my sister borrowed my car and my sister borrowed my car"


def test_doctests():
    assert doctest.testmod(S).failed == 0


def test_generator_deterministic_and_schema():
    a, b = S.generate(30, seed=3), S.generate(30, seed=3)
    assert a == b and a != S.generate(30, seed=4)
    for row in a:
        assert set(row) == {"info", "summaries", "choice", "worker", "batch", "split", "extra"}
        assert set(row["info"]) == {"id", "post", "title", "subreddit"}
        assert len(row["summaries"]) == 2
        assert all(set(s) == {"text", "policy", "note"} for s in row["summaries"])
        assert row["choice"] in (0, 1) and row["split"] == "train"
        assert 40 <= len(row["info"]["post"].split()) <= 100
        assert 2 <= len(S.post_facts(S.prompt_of(row))) <= 4


def test_post_facts_read_from_text():
    assert S.post_facts(PROMPT) == {
        ("sister", "borrowed"),
        ("uncle", "cancelled"),
        ("grandma", "lost"),
    }


def test_gold_ranking_hand_written():
    g = {
        k: S.gold_score(PROMPT, v)
        for k, v in {
            "complete": COMPLETE,
            "missing": MISSING,
            "hallucinating": HALLUCINATING,
            "garbage": GARBAGE,
            "verbose": VERBOSE,
            "rambling": RAMBLING,
        }.items()
    }
    assert g["complete"] == 1.0
    assert g["complete"] > g["missing"] > g["hallucinating"] > g["garbage"]
    assert g["complete"] > g["verbose"] and g["complete"] > g["rambling"]
    # Hand-worked: 16 words, 2/3 facts, one wrong fact (uncle, sold), "sold" not in the post.
    assert g["hallucinating"] == pytest.approx(2 / 3 - 0.5 - 1 / 16, abs=1e-5)
    assert g["missing"] == pytest.approx(2 / 3, abs=1e-5)
    assert S.gold_score(PROMPT, "") == -1.0
    # Swapping the events of two entities is two wrong facts.
    swapped = "my sister cancelled the party and my uncle borrowed my car"
    assert S.gold_score(PROMPT, swapped) < g["hallucinating"]


def test_gold_score_any_text():
    for text in ("\u00e9\u00e8 \U0001f600 ???", "my my my my my my", "x" * 1000, "TL;DR: POST"):
        assert isinstance(S.gold_score(PROMPT, text), float)
    assert isinstance(S.gold_score("no template here", "anything"), float)


def test_candidate_kinds_span_quality():
    by_kind: dict[str, list[float]] = {}
    for row in S.generate(300, seed=11):
        p = S.prompt_of(row)
        for s in row["summaries"]:
            by_kind.setdefault(s["policy"], []).append(S.gold_score(p, s["text"]))
    mean = {k.removeprefix("synthetic_"): statistics.mean(v) for k, v in by_kind.items()}
    assert mean["complete"] > mean["verbose"] > mean["missing"] > mean["hallucinated"]
    assert mean["complete"] > mean["rambling"] and mean["missing"] > mean["swapped"]


def test_bundled_file_is_regenerable_and_labels_agree_with_gold():
    rows = [json.loads(line) for line in BUNDLED_SYNTHETIC.read_text().splitlines()]
    assert BUNDLED_SYNTHETIC.stat().st_size <= 2_000_000
    assert rows == S.generate(1900, 0, "train") + S.generate(300, 0, "valid1", id_offset=1900)
    agree = decided = 0
    for row in rows:
        g0, g1 = (S.gold_score(S.prompt_of(row), s["text"]) for s in row["summaries"])
        if g0 != g1:
            decided += 1
            agree += (g0 > g1) == (row["choice"] == 0)
    # Measured 89.3% (BT labels with BETA=5 on gold-score gaps); ties (2%) excluded.
    assert agree / decided > 0.85
