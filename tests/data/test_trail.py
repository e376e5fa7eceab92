"""The trail task: the game on a hand-written world, the gold score of hand-worked episodes, the
generated rows (SkyRL's format, words of the tiny tokenizer) and the pretraining corpus."""

from __future__ import annotations

import doctest
import random
from collections import Counter

import pytest

from marlhf.data import trail
from marlhf.data.trail import World, gold

# The sister was at the party, where the keys were lost: her trail is the true one.
W = World(
    "my keys",
    "party",
    ("boss", "sister", "dog"),
    ("office", "party", "cafe"),
    {
        "boss": ("aunt", "mom", "vet"),
        "sister": ("cousin", "uncle", "coach"),
        "dog": ("dad", "tutor", "cat"),
    },
    4,
)


def conv(*actions_and_replies: str) -> list[dict]:
    """A conversation: the prompt, then actions and replies alternating."""
    out = [{"role": "user", "content": trail.prompt_text(W)}]
    for j, text in enumerate(actions_and_replies):
        out.append({"role": "assistant" if j % 2 == 0 else "user", "content": text})
    return out


def test_doctests():
    assert doctest.testmod(trail).failed == 0


def test_the_world_and_its_prompt():
    assert (W.key, W.holder) == ("sister", "coach")
    assert trail.prompt_text(W) == (
        "I lost my keys at the party. My boss is at the office, my sister found it and my dog is "
        "at the cafe."
    )
    assert World.from_info(W.info()) == W
    with pytest.raises(ValueError, match="not a consistent trail world of 5 turns"):
        World.from_info({**W.info(), "turns": 5})
    with pytest.raises(ValueError, match="extra_info is not a trail world"):
        World.from_info({"turns": 4})


def test_the_game_on_the_true_and_a_false_trail():
    g = trail.TrailGame(W, step_reward=0.1)
    assert g.step(" call my sister") == ("my sister: call my cousin.", 0.1, False)
    assert g.step(" call my uncle") == ("my uncle: I do not know.", 0.0, False)  # not the next one
    assert g.step(" call my cousin") == ("my cousin: call my uncle.", 0.1, False)
    assert g.step(" call my uncle") == (None, 0.0, True)  # the 4th turn ends the game, no answer
    g = trail.TrailGame(W)
    assert g.step("hello") == ("I do not know.", 0.0, False)
    assert g.step(" call my dog") == ("my dog: call my dad.", 0.0, False)
    assert g.step(" call my boss") == ("my boss: I do not know.", 0.0, False)  # no second trail
    assert g.step(" my cat has my keys") == (None, 0.0, True)
    g = trail.TrailGame(W)
    for person in ("sister", "cousin"):
        g.step(f" call my {person}")
    assert g.step(" call my uncle") == ("my uncle: my coach has my keys.", 0.0, False)
    assert g.step(" my coach has my keys") == (None, 1.0, True)


@pytest.mark.parametrize(
    ("episode", "score"),
    [
        # the key person first, the trail followed, the holder named: won
        ((" call my sister", "my sister: call my cousin.", " call my cousin",
          "my cousin: call my uncle.", " call my uncle", "my uncle: my coach has my keys.",
          " my coach has my keys"), 1.0),
        # a false trail followed as faithfully: its holder is the wrong one
        ((" call my boss", "my boss: call my aunt.", " call my aunt", "my aunt: call my mom.",
          " call my mom", "my mom: my vet has my keys.", " my vet has my keys"), 0.0),
        # the right holder named with a wrong object still names the holder
        ((" call my sister", "my sister: call my cousin.", " my coach has the money"), 1.0),
        # the last action is a call, not an answer
        ((" call my sister", "my sister: call my cousin.", " call my cousin"), 0.0),
        # an answer without a known name
        ((" call my sister", "...", " my neighbour has my keys"), 0.0),
        ((), 0.0),
    ],
)  # fmt: skip
def test_gold_of_hand_worked_episodes(episode, score):
    assert gold(W, conv(*episode)) == score


def test_played_games_agree_with_gold_and_first_call():
    rng = random.Random(0)
    for turns in trail.TURNS:
        world = trail.make_world(turns, rng)
        for first in world.candidates:
            messages = trail.play(world, first)
            assert sum(m["role"] == "assistant" for m in messages) == turns
            assert trail.first_call(messages) == first
            assert gold(world, messages) == float(first == world.key)


def test_rows_are_skyrl_rows_and_deterministic():
    rows = trail.rows(8, 50, seed=1, split="train")
    assert rows == trail.rows(8, 50, seed=1, split="train")
    assert rows != trail.rows(8, 50, seed=1, split="valid")
    for r in rows:
        assert set(r) == {"id", "data_source", "prompt", "env_class", "reward_spec", "extra_info"}
        assert r["env_class"] == "marlhf-trail-8" and r["prompt"][0]["role"] == "user"
        world = World.from_info(r["extra_info"])
        assert r["reward_spec"] == {"method": "rule", "ground_truth": world.holder}
        names = [*world.candidates, *(n for t in world.trails.values() for n in t)]
        assert len(set(names)) == len(names) == 24  # every name distinct
        assert world.places[world.candidates.index(world.key)] == world.place
    with pytest.raises(ValueError, match=r"the trail task has \(2, 4, 8\) turns, got 3"):
        trail.rows(3, 1)


def test_every_word_is_one_token_of_the_tiny_tokenizer():
    from transformers import AutoTokenizer

    from marlhf.models.zoo import ensure_tiny_base

    tok = AutoTokenizer.from_pretrained(ensure_tiny_base())
    for words in (trail.PEOPLE, trail.PLACES, [o.split()[1] for o in trail.OBJECTS]):
        for w in words:
            assert len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1, w
    world = trail.make_world(2, random.Random(0))
    text = trail.prompt_text(world)
    n_words = len(text.split()) + text.count(",") + text.count(".")  # punctuation is a token
    assert len(tok(text, add_special_tokens=False)["input_ids"]) == n_words == 27


def test_pretraining_games_are_wrong_first_in_the_stated_share():
    convs = trail.pretraining_conversations(1500, seed=0)
    turns = Counter(sum(m["role"] == "assistant" for m in c) for c in convs)
    assert turns == {2: 500, 4: 500, 8: 500}
    # the first call names the key person (W.key is read back from the prompt's places)
    wrong = 0
    for c in convs:
        words = c[0]["content"].replace(",", "").replace(".", "").split()
        wrong += trail.first_call(c) != words[words.index("found") - 1]
    assert abs(wrong / len(convs) - trail.PRETRAIN_WRONG_FIRST) < 0.04
    assert convs[:9] == trail.pretraining_conversations(9, seed=0)
