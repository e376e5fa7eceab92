"""Long-horizon synthetic gold tasks: the TL;DR task's facts at answer lengths of about 16, 64 and 256
tokens, and a task whose score hinges on the answer's opening.

MA-RLHF's claim is about credit assignment over long responses, and the bundled TL;DR task
(``marlhf.data.synthetic``) has 14-20-token answers. These tasks keep its world (its entity, event
and object lexicons, filler sentences, TL;DR prompt template, comparisons schema and Bradley-Terry
labellers, a gold scorer from text alone) and add a **horizon knob**: the number of key facts, hence
the answer's length. All words are in the tiny tokenizer's vocabulary (1.03-1.09 tokens per answer
word, as on the TL;DR summaries), so the bases share it.

Facts and how they are read
---------------------------
A key fact is a triple *(subject, event, object)*: ``my sister borrowed my car`` is
``("sister", "borrowed", "my car")``, ``i lost the tickets`` is ``("i", "lost", "the tickets")``.
(The TL;DR task's facts are pairs; here the object counts too, so a subject can do several things
and a post can hold forty facts.) The reader is the TL;DR task's: words are lower-cased alphanumeric
runs, sentences end at ``. ! ? ;``, an event word belongs to the last subject word before it in its
sentence (the entity words of the TL;DR task, plus ``i``), and its object is the longest known
object phrase right after it (none: the claim has object ``""``, which no post has). Claims and
unattributed subject/event words are read from the answer the same way.

Task ``synthetic-facts-{16,64,256}``: state every fact
-------------------------------------------------------
The post is 2-4, 9-12 or 34-42 fact sentences (``"My sister borrowed my car."``, ``"Then my boss
lost the keys."``, ``"Yesterday, my dog ate a sock."``; a subject and event go together at most once
per post) with a few filler sentences of the TL;DR task between them, in the prompt
``"POST\\nSubreddit: r/{subreddit}\\nPOST TEXT\\nTL;DR: "``. The complete answer states every fact
once, in any order: ``"my sister borrowed my car and my boss lost the keys and my dog ate a sock"``:
17, 62 and 230 tokens of the tiny tokenizer on average (10-26, 50-75, 202-260), with prompts of 82,
133 and 336 tokens (at most 393). With ``n`` post facts and ``u = 1/n`` (one fact's worth)::

    g = coverage - u/2 * (duplicates + hallucinated) - u/8 * excess_words - repetition - junk

- ``coverage``: fraction of the post's facts the answer claims exactly (0..1), the reward;
- ``duplicates``: claims of a fact already claimed;
- ``hallucinated``: distinct claims not in the post (a wrong subject, event or object) plus subject
  or event words that are not attributed and are not part of a post fact;
- ``excess_words``: words beyond the complete answer's length plus 2 (``budget``);
- ``repetition``: fraction of word 8-grams that repeat an earlier one (loops; every 8-gram of a
  complete answer holds a whole subject-event pair, so a complete answer repeats none);
- ``junk``: fraction of words neither in the post nor among the TL;DR task's connectives.

A wrong claim (invented, repeated, or off-side in the verdict task) costs half a fact, so a claim
pays when it is right more than a third of the time; the penalties scale with ``u`` so that a
score means the same at every horizon (with 3 facts: 0.17 per wrong claim, about 0.04 per excess
word; the TL;DR task charges 0.5 per invented fact). Why not more: the sampled claims of the shipped
256-token base are right 35-68 % of the time, by task and by quarter of the answer, so at 1.5 or
1 fact per wrong claim its later claims were worth nothing or less, and oracle PPO raised gold
mainly by cutting the answers short (``synthetic-verdict-256``: 171 -> 44 tokens in 32 steps),
which defeats a horizon knob. An empty answer scores -1, a complete concise one 1.

Task ``synthetic-verdict-{16,64,256}``: an opening the whole answer must stay consistent with
--------------------------------------------------------------------------------------------
Am I the one at fault? The post (subreddit ``AmItheAsshole``) mixes the poster's own misdeeds
(``"I lost the tickets."``) with other people's (``"My sister borrowed my car."``). One side has
more: 2-4, 10-13 or 33-39 facts, against 35-70 % as many on the other side. The answer gives its
verdict by the side its **first fact** blames (``i ...``: YTA, the poster; ``my sister ...``: NTA,
the others) and must then list the facts of that side, the reasons for its verdict, so the first
token decides which continuation is right, and the score comes only at the end::

    g = +-0.5 + coverage - u/2 * (off_side + duplicates + hallucinated) - u/8 * excess - repetition - junk

- ``+0.5`` if the first fact blames the side with more facts, ``-0.5`` if not (or no fact at all);
- ``coverage``: claimed facts of the side the opening blames, divided by the size ``n`` of the
  *correct* side (``u = 1/n``): after a wrong opening a consistent answer reaches only the
  minority's share;
- ``off_side``: true facts of the post on the other side, which do not support the verdict;
- the rest as in the facts task, with the correct side's budget. Answers: 15, 63 and 201 tokens on
  average (8-25, 48-81, 163-240); prompts 85, 175 and 432 tokens (at most 534).

A complete answer scores 1.5. The same facts behind one fact of the other side score about -1
(wrong verdict, every listed fact off-side); the minority's facts alone about 0. The decision at the
first token is worth more than everything after it.

Preference data and pretraining corpora
---------------------------------------
``generate(task, n, seed, split)`` writes comparisons in exactly the ``openai/summarize_from_feedback``
``comparisons`` schema (the adapter of ``synthetic-tldr`` reads them), two candidates per post drawn
from kinds that span the quality range (``complete``, ``reordered``, ``missing``, ``truncated``,
``hallucinated``, ``swapped``, ``verbose``, ``rambling``; for the verdict task also
``wrong_opening``, ``other_side`` and ``both_sides``), labelled by the TL;DR task's Bradley-Terry
labellers, ``P(A > B) = sigmoid(5 * (g_A - g_B))`` (the labels agree with the gold order on 77-94 %
of the pairs). The data path ``synthetic-facts-64`` (etc.) generates 1,900 train and 300 ``valid1``
rows on first use into ``$MARLHF_HOME/synthetic`` (``data_file``; not bundled: the longest task's
file is about 8 MB). ``pretraining_rows(n, horizon)`` is the corpus of the pretrained base
``tiny-base-{horizon}`` (``marlhf.tiny``): both tasks at that horizon, complete answers in post
order, except that a quarter of the verdict task's answers blame the wrong side (consistently), so
the base is unsure of its opening and RL has an early decision to learn.

>>> p = "POST\\nSubreddit: r/family\\nMy sister borrowed my car. Then my boss lost the keys.\\nTL;DR: "
>>> facts_gold(p, "my sister borrowed my car and my boss lost the keys")
1.0
>>> facts_gold(p, "my sister borrowed my car")
0.5
>>> facts_gold(p, "my sister borrowed my car and my boss lost my car")  # a wrong object
0.25
>>> v = "POST\\nSubreddit: r/AmItheAsshole\\nI lost the tickets. My sister borrowed my car. Then I broke the lamp.\\nTL;DR: "
>>> verdict_gold(v, "i lost the tickets and i broke the lamp")
1.5
>>> verdict_gold(v, "i lost the tickets and i broke the lamp and my sister borrowed my car")
1.0
>>> verdict_gold(v, "my sister borrowed my car and i lost the tickets and i broke the lamp")
-0.75
>>> verdict_gold(v, "my sister borrowed my car")  # the wrong verdict, consistently
0.0
>>> gold_scorer_for("synthetic-verdict-256") is verdict_gold, gold_scorer_for(["hh"]) is None
(True, True)
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from marlhf.data.reasoning_tasks import TASKS as ARITH_TASKS
from marlhf.data.reasoning_tasks import arith_gold
from marlhf.data.synthetic import (
    ANIMAL_EVENTS,
    ANIMALS,
    CONNECTIVES,
    DISTRACTORS,
    ENTITIES,
    EVENTS,
    HUMAN_EVENTS,
    SUBREDDITS,
    SUMMARY_FILLERS,
    TIMES,
    _fill,
    _join,
    _post_text,
    gold_score,
    labelled_comparison,
    prompt_of,
    sentence_claims,
)
from marlhf.runtime.home import home

# Bump when a generator or a scorer changes (the generated files' names and cache keys hold it).
LONG_TASKS_VERSION = 1
HORIZONS = (16, 64, 256)
VERDICTS = ("yta", "nta")
VERDICT_SUBREDDIT = "AmItheAsshole"
# The numbers of comparisons a data path generates (as many as the bundled TL;DR file holds).
N_TRAIN, N_VALID = 1900, 300
# Share of the verdict task's pretraining answers that blame the wrong side (``pretraining_rows``).
PRETRAIN_WRONG_SIDE = 0.25


@dataclass(frozen=True)
class LongTask:
    """One task: its data path, family, horizon and sizes.

    ``n_facts``: facts of the post (facts family) or of the majority side (verdict family), both
    bounds included; ``minority``: the other side's size as a fraction of the majority's (verdict);
    ``distractors``: filler sentences in the post.
    """

    name: str
    family: str
    horizon: int
    n_facts: tuple[int, int]
    distractors: tuple[int, int]
    minority: tuple[float, float] = (0.0, 0.0)


TASKS: dict[str, LongTask] = {
    t.name: t
    for t in (
        LongTask("synthetic-facts-16", "facts", 16, (2, 4), (3, 6)),
        LongTask("synthetic-facts-64", "facts", 64, (9, 12), (3, 5)),
        LongTask("synthetic-facts-256", "facts", 256, (34, 42), (2, 4)),
        LongTask("synthetic-verdict-16", "verdict", 16, (2, 4), (2, 4), (0.35, 0.7)),
        LongTask("synthetic-verdict-64", "verdict", 64, (10, 13), (2, 3), (0.35, 0.7)),
        LongTask("synthetic-verdict-256", "verdict", 256, (33, 39), (1, 2), (0.35, 0.7)),
    )
}

SUBJECTS = ENTITIES | {"i"}
_OBJECTS = frozenset(
    tuple(o.split())
    for table in (HUMAN_EVENTS, ANIMAL_EVENTS)
    for objs in table.values()
    for o in objs
)
_MAX_OBJECT = max(map(len, _OBJECTS))
_HUMANS = sorted(ENTITIES - ANIMALS)
_OTHER_TEMPLATES = (
    "My {e} {v} {o}.",
    "Then my {e} {v} {o}.",
    "{T}, my {e} {v} {o}.",
    "My {e} {v} {o} {t}.",
)
_OWN_TEMPLATES = ("I {v} {o}.", "Then I {v} {o}.", "{T}, I {v} {o}.", "I {v} {o} {t}.")

Fact = tuple[str, str, str]


# --- reader and gold scorers ---------------------------------------------------------------------
def _object_at(words: list[str], j: int) -> str:
    """The longest known object phrase starting at ``words[j]`` ("" when none does)."""
    for k in range(min(_MAX_OBJECT, len(words) - j), 0, -1):
        if tuple(words[j : j + k]) in _OBJECTS:
            return " ".join(words[j : j + k])
    return ""


def read_claims(text: str) -> tuple[list[str], list[Fact], set[str]]:
    """Words, claimed (subject, event, object) facts in order, and unattributed subject/event words."""
    words, found, loose = sentence_claims(text, SUBJECTS, EVENTS)
    return words, [(s, event, _object_at(ws, j + 1)) for s, event, ws, j in found], loose


def post_facts(prompt: str) -> set[Fact]:
    """The key facts of the post in ``prompt``."""
    return set(read_claims(_post_text(prompt))[1])


def phrase(fact: Fact) -> str:
    """How an answer states a fact: ``my sister borrowed my car``, ``i lost the tickets``."""
    subject, event, obj = fact
    return f"{'i' if subject == 'i' else 'my ' + subject} {event} {obj}"


def budget(facts: set[Fact]) -> int:
    """Words of the complete answer listing ``facts`` joined by "and", plus 2."""
    return sum(len(phrase(f).split()) for f in facts) + max(len(facts) - 1, 0) + 2


def repetition(words: list[str], n: int = 8) -> float:
    """Fraction of word ``n``-grams that repeat an earlier one (0 for fewer than ``n`` words)."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def _listing(body, claims, loose, facts, side, n, post_words, words_budget) -> float:
    """Coverage of ``side`` (normalised by ``n``) minus the penalties of the module docstring."""
    u = 1.0 / max(n, 1)
    claimed = set(claims)
    fact_words = {w for f in facts for w in f[:2]}
    hallucinated = len(claimed - facts) + len(loose - fact_words)
    off_side = len((claimed & facts) - side)
    duplicates = len(claims) - len(claimed)
    excess = max(0, len(body) - words_budget)
    vocab = set(post_words) | CONNECTIVES
    junk = sum(w not in vocab for w in body) / len(body) if body else 0.0
    coverage = len(claimed & side) * u
    penalty = u / 2 * (off_side + duplicates + hallucinated) + u / 8 * excess
    return coverage - penalty - repetition(body) - junk


def facts_gold(prompt: str, answer: str) -> float:
    """Gold score of ``answer`` on a ``synthetic-facts-*`` prompt (module docstring), from text only."""
    post_words, post_claims, _ = read_claims(_post_text(prompt))
    facts = set(post_claims)
    words, claims, loose = read_claims(answer)
    if not words:
        return -1.0
    return round(
        _listing(words, claims, loose, facts, facts, len(facts), post_words, budget(facts)), 6
    )


def _verdict_of(claims: list[Fact]) -> str | None:
    """The verdict an answer gives by its first claim: ``i ...`` -> "yta", ``my sister ...`` -> "nta"."""
    if not claims:
        return None
    return "yta" if claims[0][0] == "i" else "nta"


def answer_verdict(answer: str) -> str | None:
    """``yta``, ``nta`` or None (no claim): the side the answer's first fact blames."""
    return _verdict_of(read_claims(answer)[1])


def verdict_gold(prompt: str, answer: str) -> float:
    """Gold score of ``answer`` on a ``synthetic-verdict-*`` prompt (module docstring): the verdict
    its first fact gives, and the facts that support that verdict."""
    post_words, post_claims, _ = read_claims(_post_text(prompt))
    facts = set(post_claims)
    mine = {f for f in facts if f[0] == "i"}
    theirs = facts - mine
    correct = "yta" if len(mine) > len(theirs) else "nta"
    majority = mine if correct == "yta" else theirs
    words, claims, loose = read_claims(answer)
    if not words:
        return -1.0
    verdict = _verdict_of(claims)
    side = {"yta": mine, "nta": theirs}.get(verdict, set())
    listing = _listing(
        words, claims, loose, facts, side, len(majority), post_words, budget(majority)
    )
    return round((0.5 if verdict == correct else -0.5) + listing, 6)


def correct_verdict(prompt: str) -> str:
    """``yta`` when the poster's own facts outnumber the others' in the post, else ``nta``."""
    facts = post_facts(prompt)
    mine = sum(f[0] == "i" for f in facts)
    return "yta" if mine > len(facts) - mine else "nta"


_SCORERS: dict[str, Callable[[str, str], float]] = {
    "synthetic-tldr": gold_score,
    **{t.name: facts_gold if t.family == "facts" else verdict_gold for t in TASKS.values()},
    **dict.fromkeys(ARITH_TASKS, arith_gold),
}


def gold_scorer_for(data_path: str | Sequence[str]) -> Callable[[str, str], float] | None:
    """The gold scorer ``(prompt, response) -> float`` of a data path (or of a list of them, as
    ``--data_path`` gives): ``synthetic-tldr`` -> ``synthetic.gold_score``, ``synthetic-facts-*`` ->
    ``facts_gold``, ``synthetic-verdict-*`` -> ``verdict_gold``, ``synthetic-arith-*`` ->
    ``reasoning_tasks.arith_gold``, also in the ``name:local_path`` form; None when no entry is a synthetic task. ValueError when the entries need different scorers.
    """
    specs = [data_path] if isinstance(data_path, str) else list(data_path)
    found: dict[Callable, str] = {}
    for spec in specs:
        scorer = _SCORERS.get(spec.split(":", 1)[0])
        if scorer is not None:
            found.setdefault(scorer, spec)
    if len(found) > 1:
        raise ValueError(
            f"--data_path mixes synthetic tasks with different gold scorers ({', '.join(found.values())}); "
            "a run's gold score needs one: train on one task family at a time"
        )
    return next(iter(found), None)


# --- generator -----------------------------------------------------------------------------------
def _draw_facts(rng: random.Random, k: int, subject: str | None, taken: set[Fact]) -> list[Fact]:
    """``k`` new facts, all of ``subject`` (``"i"``) or of people and pets of the TL;DR task (None)."""
    out: list[Fact] = []
    while len(out) < k:
        e = subject or rng.choice(sorted(ENTITIES))
        table = ANIMAL_EVENTS if e in ANIMALS else HUMAN_EVENTS
        v = rng.choice(sorted(table))
        fact = (e, v, rng.choice(table[v]))
        if fact not in taken and (subject or not any(f[:2] == fact[:2] for f in taken)):
            taken.add(fact)
            out.append(fact)
    return out


def _sentence(fact: Fact, rng: random.Random) -> str:
    e, v, o = fact
    t = rng.choice(TIMES)
    template = rng.choice(_OWN_TEMPLATES if e == "i" else _OTHER_TEMPLATES)
    return template.format(e=e, v=v, o=o, t=t, T=t[0].upper() + t[1:])


def make_post(task: LongTask, rng: random.Random) -> dict:
    """One post of ``task``: ``subreddit``, ``post``, ``facts`` (in post order), ``answer`` (the
    complete reference, facts in post order), ``side`` (the facts the answer must list), ``verdict``
    (None for the facts family) and ``distractors``."""
    n = rng.randint(*task.n_facts)
    taken: set[Fact] = set()
    verdict = None
    if task.family == "facts":
        sub = rng.choice(sorted(SUBREDDITS))
        facts = _draw_facts(rng, n, None, taken)
        side = list(facts)
    else:
        sub, verdict = VERDICT_SUBREDDIT, rng.choice(VERDICTS)
        m = min(max(1, round(n * rng.uniform(*task.minority))), n - 1)
        big = _draw_facts(rng, n, "i" if verdict == "yta" else None, taken)
        small = _draw_facts(rng, m, None if verdict == "yta" else "i", taken)
        facts = big + small
        rng.shuffle(facts)
        side = [f for f in facts if f in set(big)]
    sents = [_sentence(f, rng) for f in facts]
    distractors = [_fill(d, rng) for d in rng.sample(DISTRACTORS, rng.randint(*task.distractors))]
    for d in distractors:
        sents.insert(rng.randint(0, len(sents)), d)
    answer = _join([phrase(f) for f in side], rng)
    return {
        "subreddit": sub,
        "post": " ".join(sents),
        "facts": facts,
        "side": side,
        "verdict": verdict,
        "answer": answer,
        "distractors": distractors,
    }


def _corrupt(kind: str, side: list[Fact], post: dict, rng: random.Random) -> list[str]:
    """The phrases of one candidate listing of ``side`` (see the module docstring's kinds)."""
    n = len(side)
    k = max(1, round(n * rng.uniform(0.1, 0.3)))
    phrases = [phrase(f) for f in side]
    if kind == "reordered":
        rng.shuffle(phrases)
    elif kind == "missing" and n > 1:
        drop = set(rng.sample(range(n), min(k, n - 1)))
        phrases = [p for i, p in enumerate(phrases) if i not in drop]
    elif kind == "truncated" and n > 1:
        cut = rng.randint(max(1, n // 3), n - 1)
        phrases = phrases[:cut] + [" ".join(phrases[cut].split()[: rng.randint(1, 3)])]
    elif kind == "hallucinated":
        for i in rng.sample(range(n), min(k, n)):
            e = side[i][0]
            table = ANIMAL_EVENTS if e in ANIMALS else HUMAN_EVENTS
            v = rng.choice(sorted(table))
            fact = (e, v, rng.choice(table[v]))
            if fact not in post["facts"]:
                phrases[i] = phrase(fact)
        if rng.random() < 0.5:
            phrases.insert(rng.randint(0, n), phrase((rng.choice(_HUMANS), "stole", "my idea")))
    elif kind == "swapped" and n > 1:
        for _ in range(k):
            i, j = rng.sample(range(n), 2)
            (ei, vi, oi), (ej, vj, oj) = side[i], side[j]
            if ei == ej:  # one subject (the poster's side): swap the objects
                vi, vj = vj, vi
            phrases[i], phrases[j] = phrase((ei, vj, oj)), phrase((ej, vi, oi))
    elif kind == "verbose":
        extra = [d.rstrip(".").lower() for d in post["distractors"][:2]] or ["i do not know"]
        phrases = [rng.choice(SUMMARY_FILLERS) + " " + phrases[0], *phrases[1:], *extra]
    elif kind == "rambling":
        i = rng.randrange(n)
        run = phrases[i : i + rng.randint(1, 4)]
        phrases = phrases[: i + len(run)] + run * rng.randint(1, 3) + phrases[i + len(run) :]
    return phrases


FACT_KINDS = (
    "complete", "reordered", "missing", "truncated", "hallucinated", "swapped", "verbose", "rambling"
)  # fmt: skip
VERDICT_KINDS = (*FACT_KINDS, "wrong_opening", "other_side", "both_sides")


def candidate(kind: str, post: dict, rng: random.Random) -> str:
    """One candidate answer of ``kind`` for ``post`` (a ``make_post`` result)."""
    if kind not in VERDICT_KINDS or (post["verdict"] is None and kind not in FACT_KINDS):
        raise ValueError(f"unknown candidate kind {kind!r} for this task")
    side = post["side"]
    other = [f for f in post["facts"] if f not in set(side)]
    if kind == "other_side":  # the wrong verdict, and the facts that support it
        return _join([phrase(f) for f in other], rng)
    if kind == "both_sides":  # every fact in post order: its verdict is the first fact's side
        return _join([phrase(f) for f in post["facts"]], rng)
    if kind == "wrong_opening":  # one fact of the other side first, then the complete list
        return _join([phrase(rng.choice(other))] + [phrase(f) for f in side], rng)
    return _join(_corrupt(kind, side, post, rng), rng)


def gold(task: LongTask) -> Callable[[str, str], float]:
    return facts_gold if task.family == "facts" else verdict_gold


def generate(
    task: str | LongTask, n: int, seed: int, split: str = "train", id_offset: int = 0
) -> list[dict]:
    """``n`` comparisons of ``task`` in the ``openai/summarize_from_feedback`` comparisons schema,
    labelled by Bradley-Terry on gold differences. Deterministic in all arguments."""
    task = TASKS[task] if isinstance(task, str) else task
    score = gold(task)
    kinds = FACT_KINDS if task.family == "facts" else VERDICT_KINDS
    rng = random.Random(f"{task.name}/{seed}/{split}")
    rows = []
    for i in range(n):
        post = make_post(task, rng)
        pair = rng.sample(kinds, 2)
        texts = [candidate(k, post, rng) for k in pair]
        while texts[0] == texts[1]:  # e.g. "reordered" of a 1-fact side: make it a real comparison
            pair[1] = rng.choice([k for k in kinds if k != pair[0]])
            texts[1] = candidate(pair[1], post, rng)
        info = {
            "id": f"t3_{task.family}{task.horizon}_{id_offset + i:06d}",
            "post": post["post"],
            "title": f"{task.family} {task.horizon}",
            "subreddit": post["subreddit"],
        }
        policies = [f"synthetic_{k}" for k in pair]
        batch = f"{task.name}-v{LONG_TASKS_VERSION}"
        rows.append(labelled_comparison(info, texts, policies, batch, split, score, rng))
    return rows


def data_file(name: str) -> Path:
    """The comparisons of the data path ``name`` (``N_TRAIN`` train + ``N_VALID`` ``valid1`` rows),
    generated on first use into ``$MARLHF_HOME/synthetic`` (atomic; safe with several ranks)."""
    if name not in TASKS:
        raise ValueError(
            f"--data_path: {name!r} is not a long synthetic task; known: {', '.join(TASKS)}"
        )
    target = home() / "synthetic" / f"{name}-v{LONG_TASKS_VERSION}.jsonl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = generate(name, N_TRAIN, 0, "train") + generate(
        name, N_VALID, 0, "valid1", id_offset=N_TRAIN
    )
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache may be shared
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def pretraining_rows(n: int, horizon: int, seed: int = 0) -> list[dict]:
    """``n`` posts of the two tasks at ``horizon`` (alternating) with a reference answer each, as
    ``{"id", "prompt", "chosen"}`` rows: the corpus of ``tiny-base-{horizon}``. Facts-task answers
    are complete, in post order. Verdict-task answers list the side at fault in post order, except
    that a share ``PRETRAIN_WRONG_SIDE`` of them blame the other side (consistently), as a noisy
    forum would: the base opens with the wrong side about that often when it samples, the early
    decision that RL has to learn from the end-of-answer score. The random stream
    (``"long-pretrain/{horizon}/{seed}"``) is not the one of the comparisons."""
    if horizon not in HORIZONS:
        raise ValueError(f"--horizon must be one of {HORIZONS}, got {horizon}")
    tasks = [TASKS[f"synthetic-facts-{horizon}"], TASKS[f"synthetic-verdict-{horizon}"]]
    rng = random.Random(f"long-pretrain/{horizon}/{seed}")
    rows = []
    for i in range(n):
        post = make_post(tasks[i % 2], rng)
        prompt = prompt_of({"info": {"subreddit": post["subreddit"], "post": post["post"]}})
        chosen = post["answer"]
        if post["verdict"] is not None and rng.random() < PRETRAIN_WRONG_SIDE:
            chosen = candidate("other_side", post, rng)
        rows.append({"id": i, "prompt": prompt, "chosen": chosen})
    return rows
