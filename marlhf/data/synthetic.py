"""The bundled synthetic TL;DR task and its gold scorer.

Nothing can be downloaded here, so the project ships a small summarisation task that a tiny model
(hidden 64-128, 2 layers, BPE vocabulary of 1-2k) can learn on two CPU cores, with a *gold scorer*
that says how good any summary truly is. The gold scorer plays the role of the human labellers of
``openai/summarize_from_feedback``: it produced the preference labels of the bundled comparisons,
and it can grade anything a policy writes, so a run can check that MA-PPO raised the true quality
and not only the learned reward.

The task
--------
Each post is a short Reddit-style story (40-90 words) written from small lexicons (a few hundred
distinct words). It carries 2-4 **key facts**. A fact is a pair *(entity, event)*: an entity word
("sister", "landlord", "puppy") and a past-tense event verb ("borrowed", "cancelled", "chewed"),
written in a templated sentence with an object and a time::

    Last week, my sister borrowed my car.        -> fact (sister, borrowed)
    I found out that my boss cancelled our trip. -> fact (boss, cancelled)

Entities and events are unique within a post. Between the fact sentences sit **distractor**
sentences ("Sorry for the long post.", "I am twenty two years old.") built from a separate filler
vocabulary that contains no entity and no event word, so they never carry facts. The prompt uses
the original TL;DR template, ``"POST\\nSubreddit: r/{subreddit}\\n{post}\\nTL;DR: "``.

A good summary states every fact once and nothing else, e.g. ``"my sister borrowed my car and my
boss cancelled our trip"`` (about 5 words per fact, 8-25 words in all).

The gold score
--------------
``gold_score(prompt, summary)`` reads TEXT ONLY. It extracts the facts of the post from the prompt
and the facts the summary claims, with the same reader: words are lower-cased alphanumeric runs;
sentences end at ``. ! ? ;``; within a sentence an event word is attributed to the last entity word
before it (so "my sister borrowed my car and crashed it" claims two facts about the sister). Then::

    g = coverage - 0.5 * hallucinated - 0.04 * excess_words - repetition - junk

- ``coverage``: fraction of the post's facts the summary claims correctly (0..1), the reward.
- ``hallucinated``: number of distinct claimed facts that are not in the post (a wrong event for an
  entity, an invented entity or event) plus entity/event words the post does not have as facts
  that are not attributed to anything; each costs 0.5, so dropping a fact is always better than
  inventing one.
- ``excess_words``: words beyond the budget ``6 * n_facts + 2`` (what the facts need); 0.04 each,
  so a concise summary beats a verbose one with the same facts.
- ``repetition``: fraction of repeated word bigrams (0..1), for rambling and degenerate loops.
- ``junk``: fraction of words that occur neither in the post nor among a few connective words
  ("and", "then", "my", ...), for garbage and off-topic text.

An empty summary scores -1. A complete concise summary scores 1; typical values: missing one of
three facts 0.67, one wrong event of three 0.1, a verbose complete one 0.7-0.9, word salad < 0.

Preference labels
-----------------
Each comparison pairs two candidate summaries of the same post, drawn from seven kinds that span
the quality range: ``complete``, ``reordered`` (complete, facts in another order), ``missing``
(one or two facts dropped), ``hallucinated`` (one event replaced by one not in the post, or an
extra invented fact), ``swapped`` (events of two entities exchanged), ``verbose`` (complete plus
filler and a copied distractor sentence) and ``rambling`` (a fact repeated, filler). The label is
drawn from a Bradley-Terry model on the gold scores, ``P(A > B) = sigmoid(BETA * (g_A - g_B))``
with ``BETA = 5``: a gap of 0.3 is labelled correctly 82% of the time, a gap of 1 99%, so the
labels are noisy like human ones but learnable.

The rows follow EXACTLY the ``openai/summarize_from_feedback`` ``comparisons`` schema (``info``,
``summaries``, ``choice``, ``worker``, ``batch``, ``split``, ``extra``), with ``split`` ``"train"`` or
``"valid1"`` as in the real data, so the same adapter reads both.

>>> rows = generate(2, seed=0)
>>> rows == generate(2, seed=0)
True
>>> sorted(rows[0])
['batch', 'choice', 'extra', 'info', 'split', 'summaries', 'worker']
>>> prompt = "POST\\nSubreddit: r/family\\nLast week, my sister borrowed my car. Sorry for the long post.\\nTL;DR: "
>>> gold_score(prompt, "my sister borrowed my car")
1.0
>>> gold_score(prompt, "my sister sold my car")  # a fact the post does not have
-0.7
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Collection, Sequence

# Bradley-Terry sharpness of the synthetic labellers (see module docstring).
BETA = 5.0
# Bump when the generator or the scorer changes (the data cache key and the bundled file depend on it).
SYNTHETIC_VERSION = 1

# --- lexicons ------------------------------------------------------------------------------------
# Entity pools per subreddit. Entity words never occur in objects, times or distractors.
SUBREDDITS: dict[str, tuple[str, ...]] = {
    "relationships": ("boyfriend", "girlfriend", "husband", "wife", "friend", "sister", "ex"),
    "family": ("mom", "dad", "sister", "brother", "cousin", "uncle", "aunt", "grandma"),
    "jobs": ("boss", "coworker", "manager", "intern", "client", "friend"),
    "pets": ("dog", "cat", "puppy", "kitten", "roommate", "neighbor"),
    "roommates": ("roommate", "landlord", "neighbor", "friend", "girlfriend", "boyfriend"),
    "college": ("teacher", "roommate", "coach", "classmate", "friend", "tutor"),
}
ANIMALS = frozenset({"dog", "cat", "puppy", "kitten"})
ENTITIES = frozenset(e for pool in SUBREDDITS.values() for e in pool)

# Event verbs (past tense) with objects they take. Objects contain no entity or event word.
HUMAN_EVENTS: dict[str, tuple[str, ...]] = {
    "borrowed": ("my car", "my laptop", "two hundred dollars", "my jacket"),
    "broke": ("my phone", "the window", "a promise", "my headphones"),
    "forgot": ("my birthday", "the rent", "our plans", "the keys"),
    "cancelled": ("our trip", "the dinner", "the wedding", "the party"),
    "ignored": ("my texts", "my calls", "the bills", "the rules"),
    "lost": ("my keys", "the tickets", "my passport", "the money"),
    "sold": ("my bike", "the couch", "my guitar", "the tickets"),
    "hid": ("the bills", "a secret", "my phone", "the money"),
    "quit": ("the job", "the team", "the band", "school"),
    "invited": ("twenty people", "everyone", "a stranger", "the whole team"),
    "criticized": ("my cooking", "my work", "my clothes", "my plans"),
    "skipped": ("the meeting", "the wedding", "our dinner", "the exam"),
    "stole": ("my idea", "my lunch", "the money", "my charger"),
    "cheated": ("on the exam", "at cards", "on me", "in the game"),
    "moved": ("out", "to another city", "away", "in with us"),
    "yelled": ("at me", "at the waiter", "at my parents", "at the kids"),
}
ANIMAL_EVENTS: dict[str, tuple[str, ...]] = {
    "chewed": ("my shoes", "the couch", "my charger", "the remote"),
    "scratched": ("the door", "my arm", "the couch", "the car"),
    "escaped": ("from the yard", "through the window", "at night", "from the house"),
    "ate": ("my lunch", "a sock", "the cake", "some chocolate"),
    "bit": ("the mailman", "a stranger", "my hand", "the vet"),
    "broke": ("a vase", "my phone", "the lamp", "the window"),
    "ignored": ("the rules", "my calls", "the new food", "the toys"),
    "hid": ("my keys", "the remote", "a sock", "my shoes"),
}
EVENTS = frozenset(HUMAN_EVENTS) | frozenset(ANIMAL_EVENTS)

TIMES = ("last week", "yesterday", "two days ago", "last month", "on friday", "this morning")
FACT_TEMPLATES = (
    "My {e} {v} {o} {t}.",
    "{T}, my {e} {v} {o}.",
    "Then my {e} {v} {o}.",
    "I found out that my {e} {v} {o}.",
    "To make it worse, my {e} {v} {o} {t}.",
    "So my {e} {v} {o}.",
)
DISTRACTORS = (
    "I am {age} years old.",
    "Sorry for the long post.",
    "Sorry for formatting, I am on mobile.",
    "English is not my first language.",
    "We live in a small {home}.",
    "It has been a {adj} {period}.",
    "I do not know what to do.",
    "Any advice would be great.",
    "This has been bothering me for a while.",
    "I usually try to stay calm about things.",
    "Throwaway account for obvious reasons.",
    "Everything else in my life is fine.",
    "I have been thinking about this a lot.",
    "Maybe I am overreacting here.",
    "I work long hours at a {job} downtown.",
    "We have known each other for {years} years.",
)
FILL = {
    "age": ("nineteen", "twenty two", "twenty five", "thirty", "thirty four"),
    "home": ("town", "apartment", "house", "village"),
    "job": ("store", "cafe", "office", "bakery"),
    "adj": ("stressful", "weird", "long", "rough", "strange"),
    "period": ("week", "month", "year"),
    "years": ("three", "five", "ten", "two"),
}
TITLES = (
    "Need advice about my {e}",
    "My {e} and I had a fight",
    "Not sure how to handle my {e}",
    "Am I wrong to be upset with my {e}?",
)
# Words a summary may use that need not occur in the post.
CONNECTIVES = frozenset(
    "and then also but so my the a it his her their i me was is".split()
    + "long story short basically tldr tl dr".split()
)
SUMMARY_FILLERS = ("basically", "long story short", "so basically", "tldr")
KINDS = ("complete", "reordered", "missing", "hallucinated", "swapped", "verbose", "rambling")
# Off-task candidates, not in the bundled comparisons: only preference-model pretraining reads them
# (generate_groups), so the reward model also sees text with no or few facts among post words, the
# word salad a policy drifts to when it over-optimises a reward model that never saw any.
OFF_TASK_KINDS = ("salad", "padded")
POLICIES = {k: f"synthetic_{k}" for k in KINDS}

_WORD = re.compile(r"[a-z0-9]+")
_SENT = re.compile(r"[.!?;\n]+")


# --- gold scorer ---------------------------------------------------------------------------------
def _post_text(prompt: str) -> str:
    """The post inside a TL;DR prompt (the whole string when it is not one)."""
    text = prompt
    if "\nTL;DR:" in text:
        text = text[: text.rindex("\nTL;DR:")]
    lines = text.split("\n")
    while lines and (lines[0] in ("POST", "ARTICLE") or lines[0].startswith("Subreddit: r/")):
        lines.pop(0)
    return "\n".join(lines)


def sentence_claims(
    text: str, subjects: Collection[str], events: Collection[str]
) -> tuple[list[str], list[tuple[str, str, list[str], int]], set[str]]:
    """The words of ``text`` (lower case), its claims in order and its unattributed words.

    In each sentence an event word (of ``events``) is claimed by the latest subject word (of
    ``subjects``) before it; a claim is ``(subject, event, the sentence's words, the event's
    position in them)``. An event before any subject, and a subject that no event follows before
    the next subject or the sentence's end, are loose.

    >>> text = "Bob fell. Ann Bob ran; ran"
    >>> words, claims, loose = sentence_claims(text, {"ann", "bob"}, {"fell", "ran"})
    >>> [(s, e, j) for s, e, _, j in claims], sorted(loose)
    ([('bob', 'fell', 1), ('bob', 'ran', 2)], ['ann', 'ran'])
    """
    words: list[str] = []
    claims: list[tuple[str, str, list[str], int]] = []
    loose: set[str] = set()
    for sentence in _SENT.split(text.lower()):
        ws = _WORD.findall(sentence)
        subject, pending = None, False
        for j, w in enumerate(ws):
            words.append(w)
            if w in subjects:
                if subject is not None and pending:
                    loose.add(subject)
                subject, pending = w, True
            elif w in events:
                if subject is None:
                    loose.add(w)
                else:
                    claims.append((subject, w, ws, j))
                    pending = False
        if subject is not None and pending:
            loose.add(subject)
    return words, claims, loose


def _read(text: str) -> tuple[list[str], set[tuple[str, str]], set[str]]:
    """Words, claimed (entity, event) facts and unattributed entity/event words of ``text``."""
    words, claims, loose = sentence_claims(text, ENTITIES, EVENTS)
    return words, {(entity, event) for entity, event, _, _ in claims}, loose


def post_facts(prompt: str) -> set[tuple[str, str]]:
    """The key (entity, event) facts of the post in ``prompt``."""
    return _read(_post_text(prompt))[1]


def gold_score(prompt: str, summary: str) -> float:
    """True quality of ``summary`` for the post in ``prompt``, from text only (module docstring)."""
    post_words, facts, _ = _read(_post_text(prompt))
    words, claimed, loose = _read(summary)
    if not words:
        return -1.0
    n = max(len(facts), 1)
    coverage = len(claimed & facts) / n
    fact_words = {w for f in facts for w in f}
    hallucinated = len(claimed - facts) + len(loose - fact_words)
    excess = max(0, len(words) - (6 * n + 2))
    bigrams = list(zip(words, words[1:], strict=False))
    repetition = (len(bigrams) - len(set(bigrams))) / len(bigrams) if bigrams else 0.0
    vocab = set(post_words) | CONNECTIVES
    junk = sum(w not in vocab for w in words) / len(words)
    g = coverage - 0.5 * hallucinated - 0.04 * excess - repetition - junk
    return round(g, 6)


# --- generator -----------------------------------------------------------------------------------
def _fact_phrase(e: str, v: str, o: str) -> str:
    return f"my {e} {v} {o}"


def _join(phrases: list[str], rng: random.Random) -> str:
    if len(phrases) == 1:
        return phrases[0]
    sep = rng.choice((", ", " and "))
    return sep.join(phrases[:-1]) + " and " + phrases[-1]


def _fill(template: str, rng: random.Random) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: rng.choice(FILL[m.group(1)]), template)


def _events_for(e: str) -> dict[str, tuple[str, ...]]:
    return ANIMAL_EVENTS if e in ANIMALS else HUMAN_EVENTS


def _make_post(rng: random.Random):
    sub = rng.choice(sorted(SUBREDDITS))
    n_facts = rng.choice((2, 3, 3, 4))
    entities = rng.sample(SUBREDDITS[sub], n_facts)
    used_verbs: set[str] = set()
    facts = []
    for e in entities:
        verb = rng.choice(sorted(set(_events_for(e)) - used_verbs))
        used_verbs.add(verb)
        facts.append((e, verb, rng.choice(_events_for(e)[verb])))
    fact_sents = []
    for e, v, o in facts:
        t = rng.choice(TIMES)
        s = rng.choice(FACT_TEMPLATES).format(e=e, v=v, o=o, t=t, T=t[0].upper() + t[1:])
        fact_sents.append(s)
    target = rng.randint(40, 90)
    distractors: list[str] = []
    pool = list(DISTRACTORS)
    rng.shuffle(pool)
    length = sum(len(s.split()) for s in fact_sents)
    while pool and length < target:
        d = _fill(pool.pop(), rng)
        distractors.append(d)
        length += len(d.split())
    # Interleave: facts keep their order, distractors go between them at random.
    sents = list(fact_sents)
    for d in distractors:
        sents.insert(rng.randint(0, len(sents)), d)
    post = " ".join(sents)
    title = rng.choice(TITLES).format(e=entities[0])
    return sub, title, post, facts, distractors


def _candidate(kind: str, facts, distractors, rng: random.Random) -> str:
    phrases = [_fact_phrase(*f) for f in facts]
    if kind == "complete":
        return _join(phrases, rng)
    if kind == "reordered":
        rng.shuffle(phrases)
        return _join(phrases, rng)
    if kind == "missing":
        k = rng.randint(1, max(1, len(phrases) - 2)) if len(phrases) > 2 else 1
        keep = sorted(rng.sample(range(len(phrases)), len(phrases) - k))
        return _join([phrases[i] for i in keep], rng)
    if kind == "hallucinated":
        i = rng.randrange(len(facts))
        e, v, o = facts[i]
        if rng.random() < 0.5:
            # Replace one event by one the post does not have.
            post_verbs = {f[1] for f in facts}
            new_v = rng.choice(sorted(set(_events_for(e)) - post_verbs))
            phrases[i] = _fact_phrase(e, new_v, rng.choice(_events_for(e)[new_v]))
        else:
            # Add an invented fact about an entity the post does not mention.
            post_ents = {f[0] for f in facts}
            new_e = rng.choice(sorted(ENTITIES - post_ents - ANIMALS))
            new_v = rng.choice(sorted(HUMAN_EVENTS))
            phrases.insert(rng.randint(0, len(phrases)), _fact_phrase(new_e, new_v, "it"))
        return _join(phrases, rng)
    if kind == "swapped":
        if len(facts) < 2:
            return _join(phrases, rng)
        i, j = rng.sample(range(len(facts)), 2)
        swapped = list(facts)
        (ei, vi, oi), (ej, vj, oj) = facts[i], facts[j]
        swapped[i], swapped[j] = (ei, vj, oj), (ej, vi, oi)
        return _join([_fact_phrase(*f) for f in swapped], rng)
    if kind == "verbose":
        extra = rng.choice(distractors).rstrip(".").lower() if distractors else "i do not know"
        return f"{rng.choice(SUMMARY_FILLERS)} {_join(phrases, rng)} and {extra}"
    if kind == "rambling":
        i = rng.randrange(len(phrases))
        rep = [phrases[i]] * rng.randint(2, 3)
        return _join(phrases + rep, rng) + " " + rng.choice(SUMMARY_FILLERS)
    if kind in OFF_TASK_KINDS:
        return _off_task(kind, phrases, distractors, rng)
    raise ValueError(f"unknown candidate kind {kind!r}")


def _off_task(kind: str, phrases: list[str], distractors: list[str], rng: random.Random) -> str:
    """``salad``: 4-16 words of the post's distractor sentences ("sorry" if it has none) in random order;
    ``padded``: a ``complete`` or ``missing`` summary with 2-8 such words around it."""
    pool = [w for d in distractors for w in d.rstrip(".").split()] or ["sorry"]
    if kind == "salad":
        return " ".join(rng.choice(pool) for _ in range(rng.randint(4, 16)))
    keep = phrases if rng.random() < 0.5 else rng.sample(phrases, max(1, len(phrases) - 1))
    words = [rng.choice(pool) for _ in range(rng.randint(2, 8))]
    cut = rng.randint(0, len(words))
    return " ".join([*words[:cut], _join(keep, rng), *words[cut:]])


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def prompt_of(row: dict) -> str:
    """The TL;DR prompt of a generated row (the template the adapter uses)."""
    info = row["info"]
    return f"POST\nSubreddit: r/{info['subreddit']}\n{info['post']}\nTL;DR: "


def labelled_comparison(
    info: dict,
    texts: Sequence[str],
    policies: Sequence[str],
    batch: str,
    split: str,
    score: Callable[[str, str], float],
    rng: random.Random,
) -> dict:
    """One ``comparisons`` row of two summaries of ``info``'s post, its ``choice`` drawn from the
    Bradley–Terry model on ``score`` (``P(0 preferred) = sigmoid(BETA * (g0 - g1))``); draws the
    worker id, then the label, from ``rng`` (the order the bundled file was generated in)."""
    row = {
        "info": info,
        "summaries": [
            {"text": t, "policy": k, "note": None} for t, k in zip(texts, policies, strict=True)
        ],
        "choice": 0,
        "worker": f"gold{rng.randrange(8)}",
        "batch": batch,
        "split": split,
        "extra": {"confidence": None},
    }
    prompt = prompt_of(row)
    g0, g1 = (score(prompt, t) for t in texts)
    row["choice"] = 0 if rng.random() < _sigmoid(BETA * (g0 - g1)) else 1
    return row


def generate(n: int, seed: int, split: str = "train", id_offset: int = 0) -> list[dict]:
    """``n`` synthetic comparisons in the ``openai/summarize_from_feedback`` comparisons schema.

    Deterministic in ``(n, seed, split, id_offset)``; every post gets one comparison. ``split`` is
    written to each row's ``split`` field ("train" or "valid1" in the bundled file).
    """
    rng = random.Random(f"synthetic-tldr/{seed}/{split}")
    rows = []
    for i in range(n):
        sub, title, post, facts, distractors = _make_post(rng)
        kinds = rng.sample(KINDS, 2)
        texts = [_candidate(k, facts, distractors, rng) for k in kinds]
        if texts[0] == texts[1]:  # e.g. "swapped" on a 1-fact post; make it a real comparison
            kinds[1] = "missing" if len(facts) > 1 else "hallucinated"
            texts[1] = _candidate(kinds[1], facts, distractors, rng)
        info = {"id": f"t3_syn{id_offset + i:06d}", "post": post, "title": title, "subreddit": sub}
        policies = [POLICIES[k] for k in kinds]
        batch = f"synthetic{SYNTHETIC_VERSION}"
        rows.append(labelled_comparison(info, texts, policies, batch, split, gold_score, rng))
    return rows


def pretraining_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` fresh posts with a correct summary each, as ``{"id", "prompt", "chosen"}`` rows.

    The corpus of the embedded *pretrained* tiny model (``tiny-base``, see ``marlhf.tiny``): it plays
    the part of the web text a real base model has read before fine-tuning, so the base can already
    read a post and write a TL;DR in the right format, but binds events to the wrong people often
    (that is what SFT and RLHF then improve). The summaries are ``complete`` or ``reordered``; the
    random stream (``"pretrain/{seed}"``) is not the one of the bundled comparisons.
    """
    rng = random.Random(f"pretrain/{seed}")
    rows = []
    for i in range(n):
        sub, _title, post, facts, distractors = _make_post(rng)
        kind = rng.choice(("complete", "reordered"))
        summary = _candidate(kind, facts, distractors, rng)
        prompt = prompt_of({"info": {"subreddit": sub, "post": post}})
        rows.append({"id": i, "prompt": prompt, "chosen": summary})
    return rows


def generate_groups(n: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[dict]:
    """``n`` fresh posts, each with one candidate summary per kind of ``kinds`` and a
    Bradley-Terry label for every pair of them: the K-wise comparisons of preference-model
    pretraining (``marlhf.pipeline.preference_pretraining``), labelled exactly as the comparisons of
    :func:`generate` (one draw of ``P(A > B) = sigmoid(BETA * (g_A - g_B))`` per pair).

    Rows ``{"prompt", "texts", "kinds", "pairs"}``; ``pairs`` lists ``(winner, loser)`` indices into
    ``texts``; identical candidates (e.g. a two-fact ``reordered`` equal to ``complete``) are kept
    once. Deterministic in ``(n, seed, kinds)``; the random stream (``"groups/{seed}"``) is not the
    one of the bundled comparisons.

    >>> g = generate_groups(1, seed=0)[0]
    >>> len(g["texts"]) == len(g["kinds"]) and len(g["pairs"]) == len(g["texts"]) * (len(g["texts"]) - 1) // 2
    True
    >>> generate_groups(2, seed=0) == generate_groups(2, seed=0)
    True
    """
    unknown = sorted(set(kinds) - set(KINDS) - set(OFF_TASK_KINDS))
    if unknown:
        raise ValueError(
            f"generate_groups: unknown kinds {unknown}; choose from {KINDS + OFF_TASK_KINDS}"
        )
    rng = random.Random(f"groups/{seed}")
    rows = []
    for _ in range(n):
        sub, _title, post, facts, distractors = _make_post(rng)
        prompt = prompt_of({"info": {"subreddit": sub, "post": post}})
        texts: list[str] = []
        names: list[str] = []
        for kind in kinds:
            text = _candidate(kind, facts, distractors, rng)
            if text not in texts:
                texts.append(text)
                names.append(kind)
        gold = [gold_score(prompt, t) for t in texts]
        pairs = []
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                first = rng.random() < _sigmoid(BETA * (gold[i] - gold[j]))
                pairs.append((i, j) if first else (j, i))
        rows.append({"prompt": prompt, "texts": texts, "kinds": names, "pairs": pairs})
    return rows
