"""The long-horizon synthetic tasks (``marlhf.data.long_tasks``): generator, gold scorers, data paths."""

import doctest
import json
import random
import statistics
from types import SimpleNamespace

import pytest

import marlhf.data.long_tasks as L
from marlhf.data.synthetic import gold_score, prompt_of

FACTS = [
    ("sister", "borrowed", "my car"),
    ("boss", "lost", "the keys"),
    ("dog", "ate", "a sock"),
    ("uncle", "cancelled", "the party"),
]
PROMPT = (
    "POST\nSubreddit: r/family\nMy sister borrowed my car. Sorry for the long post. Then my boss "
    "lost the keys. Yesterday, my dog ate a sock. I am thirty years old. My uncle cancelled the "
    "party last week.\nTL;DR: "
)
COMPLETE = "my sister borrowed my car and my boss lost the keys and my dog ate a sock and my uncle cancelled the party"
# the poster has 3 facts, the others 2: the verdict is "yta" (you are the one at fault)
VPROMPT = (
    "POST\nSubreddit: r/AmItheAsshole\nI lost the tickets. My sister borrowed my car. Then I broke "
    "the lamp. Sorry for the long post. My boss lost the keys. Yesterday, I skipped the exam.\nTL;DR: "
)
MINE = "i lost the tickets and i broke the lamp and i skipped the exam"
THEIRS = "my sister borrowed my car and my boss lost the keys"


def _post(name: str, seed: int = 0) -> tuple[str, dict]:
    post = L.make_post(L.TASKS[name], random.Random(seed))
    return prompt_of({"info": {"subreddit": post["subreddit"], "post": post["post"]}}), post


def test_doctests():
    assert doctest.testmod(L).failed == 0


def test_reader_finds_the_triples_of_a_hand_written_post():
    assert L.post_facts(PROMPT) == set(FACTS)
    words, claims, loose = L.read_claims("my sister borrowed my car and lost the keys and my mom")
    assert claims == [("sister", "borrowed", "my car"), ("sister", "lost", "the keys")]
    assert loose == {"mom"} and len(words) == 12
    # an event with no known object after it claims the object "", which no post has
    assert L.read_claims("my dog ate")[1] == [("dog", "ate", "")]


@pytest.mark.parametrize("name", sorted(L.TASKS))
def test_generated_posts_are_read_back_and_their_reference_is_perfect(name):
    task = L.TASKS[name]
    best = 1.0 if task.family == "facts" else 1.5
    for seed in range(30):
        prompt, post = _post(name, seed)
        assert L.post_facts(prompt) == set(post["facts"])
        assert L.gold(task)(prompt, post["answer"]) == best
        if task.family == "verdict":
            assert L.correct_verdict(prompt) == post["verdict"] == L.answer_verdict(post["answer"])
            assert len(post["side"]) > len(post["facts"]) - len(post["side"])


def test_answer_lengths_follow_the_horizon_in_tiny_tokens():
    """Reference answers in tokens of the policies' (tiny) tokenizer, 200 posts per task."""
    from transformers import AutoTokenizer

    from marlhf.models.zoo import BASE_DIR

    tok = AutoTokenizer.from_pretrained(BASE_DIR)
    bands = {16: (13, 20), 64: (55, 72), 256: (192, 256)}
    for name, task in L.TASKS.items():
        posts = [_post(name, s) for s in range(200)]
        lengths = [len(tok(p["answer"], add_special_tokens=False)["input_ids"]) for _, p in posts]
        prompts = [len(tok(pr)["input_ids"]) for pr, _ in posts]
        lo, hi = bands[task.horizon]
        assert lo <= statistics.mean(lengths) <= hi, (name, statistics.mean(lengths))
        assert max(prompts) + max(lengths) < 800, name  # fits the bases' 1024 positions
        words = sum(len(p["answer"].split()) for _, p in posts)
        assert sum(lengths) / words < 1.25, name  # the tiny tokenizer covers the vocabulary


def test_facts_gold_monotone_in_facts_covered():
    phrases = [L.phrase(f) for f in FACTS]
    golds = [L.facts_gold(PROMPT, " and ".join(phrases[:k])) for k in range(1, 5)]
    assert golds == [0.25, 0.5, 0.75, 1.0]  # k/4: no penalty for a concise partial answer
    assert L.facts_gold(PROMPT, COMPLETE) == 1.0
    # any order is fine
    assert L.facts_gold(PROMPT, " and ".join(reversed(phrases))) == 1.0
    # on a 256-token post: dropping facts one by one lowers the score every time
    prompt, post = _post("synthetic-facts-256", 3)
    side = [L.phrase(f) for f in post["side"]]
    scores = [L.facts_gold(prompt, " and ".join(side[:k])) for k in range(len(side), 0, -5)]
    assert all(a > b for a, b in zip(scores, scores[1:], strict=False))


def test_facts_gold_penalises_hallucination_repetition_verbosity_and_junk():
    three = " and ".join(L.phrase(f) for f in FACTS[:3])
    # a wrong object: the fact is not covered and costs half a fact -> worse than leaving it out
    wrong = three + " and my uncle cancelled my car"
    assert L.facts_gold(PROMPT, wrong) == pytest.approx(0.75 - 0.5 / 4, abs=1e-5)
    assert L.facts_gold(PROMPT, wrong) < L.facts_gold(PROMPT, three)
    # an invented subject that is not attributed (a loose entity word) is a hallucination too
    # (26 words: 1 beyond the budget; "cousin" is not in the post: junk 1/26)
    expected = 1 - 0.5 / 4 - 0.25 / 8 - 1 / 26
    assert L.facts_gold(PROMPT, COMPLETE + " and my cousin") == pytest.approx(expected, abs=1e-5)
    # stating a fact twice costs half a fact's worth
    twice = COMPLETE + " and my dog ate a sock"
    assert L.facts_gold(PROMPT, twice) == pytest.approx(1 - 0.25 / 2 - 0.25 / 8 * 4, abs=1e-5)
    # a loop: the whole answer twice; 8-gram repetition plus duplicates plus excess words
    assert L.facts_gold(PROMPT, COMPLETE + " and " + COMPLETE) < -0.5
    # verbosity: 8 post words beyond the budget (complete + 2) cost u/8 each
    verbose = COMPLETE + " and sorry for the long post and thirty years old"
    assert len(verbose.split()) - L.budget(set(FACTS)) == 8
    assert L.facts_gold(PROMPT, verbose) == pytest.approx(1 - 8 * 0.25 / 8, abs=1e-5)
    # junk: words that are neither in the post nor connectives
    assert L.facts_gold(PROMPT, "qwerty zzz lorem ipsum blah blah") < -0.9
    assert L.facts_gold(PROMPT, "") == -1.0
    for text in ("\u00e9\u00e8 \U0001f600 ???", "my my my my my my", "x" * 1000, "TL;DR: POST"):
        assert isinstance(L.facts_gold(PROMPT, text), float)


def test_penalties_scale_with_the_number_of_facts():
    """One invented fact costs half a fact's worth at every horizon (u = 1/n)."""
    for name in ("synthetic-facts-16", "synthetic-facts-64", "synthetic-facts-256"):
        prompt, post = _post(name, 1)
        n = len(post["facts"])
        # the first subject with the second fact's event and object: every word is in the post
        (e1, _, _), (e2, v2, o2) = next(
            (f, g)
            for f in post["facts"]
            for g in post["facts"]
            if f[0] != g[0] and (f[0], g[1], g[2]) not in post["facts"]
        )
        fake = (e1, v2, o2)
        answer = post["answer"] + " and " + L.phrase(fake)
        excess = max(0, len(answer.split()) - L.budget(set(post["facts"])))
        assert L.facts_gold(prompt, answer) == pytest.approx(
            1 - 0.5 / n - excess / (8 * n), abs=1e-5
        )


def test_verdict_score_hinges_on_the_opening():
    assert L.correct_verdict(VPROMPT) == "yta"  # 3 facts of the poster, 2 of the others
    assert L.answer_verdict(MINE) == "yta" and L.answer_verdict(THEIRS) == "nta"
    assert L.verdict_gold(VPROMPT, MINE) == 1.5
    # the wrong verdict with the facts that support it: -0.5 + the minority's share, 2 of 3
    assert L.verdict_gold(VPROMPT, THEIRS) == pytest.approx(-0.5 + 2 / 3, abs=1e-5)
    # the same 26 words in two orders: the first fact decides which ones count against the answer
    # (u = 1/3; 10 words beyond the budget of 16 cost u/8 each)
    right_first = L.verdict_gold(VPROMPT, MINE + " and " + THEIRS)
    wrong_first = L.verdict_gold(VPROMPT, THEIRS + " and " + MINE)
    assert right_first == pytest.approx(0.5 + 1 - 0.5 * 2 / 3 - 10 / 24, abs=1e-5)
    assert wrong_first == pytest.approx(-0.5 + 2 / 3 - 0.5 * 3 / 3 - 10 / 24, abs=1e-5)
    # partial answers are graded; one fact of the other side costs half a fact's worth
    partial = "i lost the tickets and i broke the lamp"
    assert L.verdict_gold(VPROMPT, partial) == pytest.approx(0.5 + 2 / 3, abs=1e-5)
    mixed = MINE + " and my boss lost the keys"  # 4 words beyond the budget
    assert L.verdict_gold(VPROMPT, mixed) == pytest.approx(1.5 - 0.5 / 3 - 4 / 24, abs=1e-5)
    # no fact at all: no verdict
    assert L.answer_verdict("sorry for the long post") is None
    assert L.verdict_gold(VPROMPT, "sorry for the long post") == -0.5
    assert L.verdict_gold(VPROMPT, "") == -1.0
    # on generated 256-token posts: one fact of the other side in front of the complete answer
    # turns 1.5 into about -1; the same fact at the end costs only half a fact and its words
    for seed in range(10):
        prompt, post = _post("synthetic-verdict-256", seed)
        other = next(f for f in post["facts"] if f not in post["side"])
        n = len(post["side"])
        assert L.verdict_gold(prompt, post["answer"]) == 1.5
        assert L.verdict_gold(prompt, L.phrase(other) + " and " + post["answer"]) < -0.9
        last = L.verdict_gold(prompt, post["answer"] + " and " + L.phrase(other))
        assert 1.5 - 0.5 / n - 8 / (8 * n) <= last < 1.5


def test_comparisons_schema_labels_and_kinds():
    for name in ("synthetic-facts-64", "synthetic-verdict-16"):
        rows = L.generate(name, 200, seed=1)
        assert rows == L.generate(name, 200, seed=1) and rows != L.generate(name, 200, seed=2)
        task = L.TASKS[name]
        by_kind: dict[str, list[float]] = {}
        agree = decided = 0
        for row in rows:
            assert set(row) == {"info", "summaries", "choice", "worker", "batch", "split", "extra"}
            assert set(row["info"]) == {"id", "post", "title", "subreddit"}
            g = [L.gold(task)(prompt_of(row), s["text"]) for s in row["summaries"]]
            for s, v in zip(row["summaries"], g, strict=True):
                by_kind.setdefault(s["policy"].removeprefix("synthetic_"), []).append(v)
            if g[0] != g[1]:
                decided += 1
                agree += (g[0] > g[1]) == (row["choice"] == 0)
        mean = {k: statistics.mean(v) for k, v in by_kind.items()}
        top = 1.0 if task.family == "facts" else 1.5
        assert mean["complete"] == mean["reordered"] == top
        assert top > mean["missing"] > mean["hallucinated"]
        assert mean["missing"] > mean["swapped"] and mean["complete"] > mean["rambling"]
        if task.family == "verdict":
            assert mean["wrong_opening"] < mean["other_side"] < mean["missing"]
            assert mean["both_sides"] < mean["missing"]
        # measured: 0.79 (facts-64), 0.95 (verdict-16); BT labels with BETA=5 on gold gaps
        assert agree / decided > 0.72, name


def test_pretraining_rows_alternate_tasks_and_are_apart_from_the_comparisons():
    rows = L.pretraining_rows(400, 64)
    assert rows[:20] == L.pretraining_rows(20, 64) and rows[:20] != L.pretraining_rows(
        20, 64, seed=1
    )
    subs = [r["prompt"].split("\n")[1] for r in rows]
    assert subs[1::2] == ["Subreddit: r/AmItheAsshole"] * 200
    assert all(s != "Subreddit: r/AmItheAsshole" for s in subs[::2])
    assert all(L.facts_gold(r["prompt"], r["chosen"]) == 1.0 for r in rows[::2])
    # verdict answers: the side at fault, complete (1.5), or in about a quarter of the rows the
    # other side, complete and consistent (the wrong opening: -0.5 + the minority's share)
    wrong = 0
    for r in rows[1::2]:
        g = L.verdict_gold(r["prompt"], r["chosen"])
        if L.answer_verdict(r["chosen"]) == L.correct_verdict(r["prompt"]):
            assert g == 1.5
        else:
            wrong += 1
            assert -0.5 < g < 0.25
    assert 0.18 < wrong / 200 < 0.32  # PRETRAIN_WRONG_SIDE = 0.25
    posts = {prompt_of(r) for r in L.generate("synthetic-facts-64", 50, 0)}
    assert not posts & {r["prompt"] for r in rows}
    with pytest.raises(ValueError, match="--horizon"):
        L.pretraining_rows(2, 32)


def test_gold_scorer_for_data_paths():
    assert L.gold_scorer_for("synthetic-tldr") is gold_score
    assert L.gold_scorer_for(["synthetic-facts-16"]) is L.facts_gold
    assert L.gold_scorer_for(("synthetic-facts-256:/data/x.jsonl",)) is L.facts_gold
    assert L.gold_scorer_for(["synthetic-verdict-64", "hh"]) is L.verdict_gold
    # one scorer for several horizons of a family
    assert L.gold_scorer_for(["synthetic-facts-16", "synthetic-facts-256"]) is L.facts_gold
    assert L.gold_scorer_for(["Dahoas/rm-static", "data/train.jsonl"]) is None
    with pytest.raises(ValueError, match="synthetic-tldr, synthetic-facts-64"):
        L.gold_scorer_for(["synthetic-tldr", "synthetic-facts-64"])


def test_ppo_stage_uses_the_task_gold_scorer():
    from marlhf.stages.ppo.scoring import gold_scorer as _gold_scorer

    def cfg(*paths):
        return SimpleNamespace(data_path=paths)

    assert _gold_scorer(cfg("synthetic-facts-256")) is L.facts_gold
    assert _gold_scorer(cfg("synthetic-verdict-16")) is L.verdict_gold
    assert _gold_scorer(cfg("synthetic-tldr")) is gold_score
    assert _gold_scorer(cfg("hh")) is None


def test_data_path_generates_once_and_loads_through_the_adapter(tmp_path, monkeypatch):
    from marlhf.data.sources import load_examples
    from marlhf.data.tokenize import _source_fingerprint

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path))
    train, bad = load_examples("synthetic-verdict-16", "train")
    valid, _ = load_examples("synthetic-verdict-16", "eval")
    assert (len(train), len(valid), bad) == (L.N_TRAIN, L.N_VALID, 0)
    path = tmp_path / "synthetic" / f"synthetic-verdict-16-v{L.LONG_TASKS_VERSION}.jsonl"
    assert path.is_file()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[:5] == L.generate("synthetic-verdict-16", 5, 0, "train")
    mtime = path.stat().st_mtime_ns
    assert load_examples("synthetic-verdict-16", "train", max_samples=3)[0] == train[:3]
    assert path.stat().st_mtime_ns == mtime  # not regenerated
    ex = train[0]
    assert ex.prompt_id.startswith("synthetic-verdict-16/") and ex.prompt.endswith("\nTL;DR: ")
    assert "Subreddit: r/AmItheAsshole" in ex.prompt
    texts = {s["text"] for s in rows[0]["summaries"]}
    assert {ex.chosen, ex.rejected} == texts
    fp = _source_fingerprint("synthetic-verdict-16")
    assert fp == {
        "spec": "synthetic-verdict-16",
        "generator": f"long_tasks v{L.LONG_TASKS_VERSION}",
    }
    with pytest.raises(ValueError, match="not a long synthetic task"):
        L.data_file("synthetic-facts-32")
