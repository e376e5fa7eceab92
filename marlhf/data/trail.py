"""The bundled multi-turn task ``marlhf-trail-{2,4,8}``: an early turn's choice decides the final
reward.

A macro action is one decision; in a multi-turn episode the natural one is a turn. This task makes
the first turn the decision that matters and puts the reward at the end, 1, 3 or 7 turns later, so
credit has turns to travel, and it is small enough for the tiny models on a CPU.

The game
--------
The user lost something somewhere and names three people: one of them found it, the others are
elsewhere::

    I lost my keys at the party. My sister is at the office, my boss found it and my dog is at the
    cafe.

The agent phones people. Each of the three knows someone who knows someone ...: each starts a trail
of ``turns - 1`` names whose last one holds the object. Only the one who found it (the *key*
person: the boss, who was at the party) starts the true trail, along which the object was passed
on; the others start trails that look the same and end at the wrong holder. (Which of the three
found it is written in the prompt, for a small model to read; a clue that has to be matched, such as
"the one at the place where it was lost", is associative recall, which the 2-layer tiny models did
not learn in 1,500 steps of clean examples, where this one takes 100.) A game of ``turns`` turns (the environment's ``done`` comes at
the last one, or at an answer)::

    > call my boss                       turn 1: the decision (one of three)
    my boss: call my cousin.
    > call my cousin                     turns 2 .. turns-1: follow the trail (copy the name)
    my cousin: my uncle has my keys.
    > my uncle has my keys               turn `turns`: the answer

Calling anyone but the next person on the trail gets ``my X: I do not know.`` (the turn is lost;
every turn is needed to reach the holder), a text that is no call gets ``I do not know.``, and an
answer (``my X has ...``) ends the game early. The reward comes at the end: 1 when the answer names
the true holder, else 0. Nothing after the first turn tells a true trail from a false one, so the
only way to the reward is the first call; the later turns only have to copy a name. With
``env_config`` ``{"step_reward": r}`` each call that someone answers with a name (on any trail)
earns ``r``, a per-turn reward that does not give the true trail away.

The gold score of an episode is its final reward: 1 when the last action is an answer naming the
holder of the true trail, else 0, read from the row's world (``extra_info``) and the conversation's
text (:func:`gold`). All words are single tokens of the tiny tokenizer (its TL;DR vocabulary):
with the template a prompt is 30 tokens, and a game of 2, 4 and 8 turns played to the end (the
trail followed) 52, 80 and 136 tokens.

Rows, the chat template, the pretraining corpus
-----------------------------------------------
:func:`rows` makes prompt rows in SkyRL's dataset format (``prompt`` as messages, ``env_class``
``marlhf-trail-{turns}``, ``reward_spec.ground_truth`` the true holder, ``extra_info`` the world).
The tiny tokenizer has no chat template; :data:`CHAT_TEMPLATE` is one it spells in its own tokens:
a user or tool message is its text on a line, an assistant message ``>`` and its text, then the
end-of-turn token ``<eos>`` and a newline; the generation prompt is ``>``.
:func:`pretraining_conversations` is the corpus of the shipped base ``tiny-base-trail``: games of
2, 4 and 8 turns played to the end, following the trail faithfully, whose first call is the key
person except in a share :data:`PRETRAIN_WRONG_FIRST` of them, where it is another of the three
(and the answer that trail's holder): the base is unsure of its first call, the decision RL has to
learn from the reward at the end.

>>> w = World("my keys", "party", ("sister", "boss", "dog"), ("office", "party", "cafe"),
...           {"sister": ("aunt", "mom"), "boss": ("cousin", "uncle"), "dog": ("vet", "coach")}, 3)
>>> w.key, w.holder
('boss', 'uncle')
>>> g = TrailGame(w)
>>> g.step(" call my boss")
('my boss: call my cousin.', 0.0, False)
>>> g.step(" call my cousin")
('my cousin: my uncle has my keys.', 0.0, False)
>>> g.step(" my uncle has my keys")
(None, 1.0, True)
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Bump when the generator or the game changes (generated rows and the base's recipe hold it).
TRAIL_VERSION = 1
TURNS = (2, 4, 8)
CANDIDATES = 3  # people named in the prompt
# Share of the pretraining games whose first call is not the key person (pretraining_conversations).
PRETRAIN_WRONG_FIRST = 0.4

# Single tokens of the tiny tokenizer (with a leading space), as the TL;DR task spells them.
PEOPLE = (
    "aunt", "boss", "brother", "classmate", "client", "coach", "cousin", "coworker", "dad",
    "friend", "girlfriend", "boyfriend", "grandma", "husband", "intern", "landlord", "mailman",
    "manager", "mom", "neighbor", "roommate", "sister", "teacher", "tutor", "uncle", "vet",
    "waiter", "wife", "dog", "cat", "puppy", "kitten",
)  # fmt: skip
PLACES = (
    "party", "office", "cafe", "bakery", "store", "school", "house", "apartment", "wedding",
    "meeting", "dinner", "game",
)  # fmt: skip
OBJECTS = (
    "my keys", "the tickets", "my phone", "my laptop", "my passport", "the money", "my jacket",
    "my charger", "my guitar", "the remote", "my headphones", "my shoes",
)  # fmt: skip

# User, system and tool messages: their text on a line; the assistant's: ">" + its text + <eos>.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    ">{{ message['content'] }}{{ eos_token }}\n{% else %}{{ message['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}>{% endif %}"
)
DONT_KNOW = "I do not know."
_WORD = re.compile(r"[a-z]+")
_PEOPLE = frozenset(PEOPLE)


@dataclass(frozen=True)
class World:
    """One game: the ``object`` lost at ``place``; the ``candidates`` named in the prompt and their
    ``places`` (in prompt order); ``trails[c]``: the names candidate ``c`` leads to, in order, the
    last one the holder of that trail; ``turns``: the game's turns (``len(trail) + 1``)."""

    object: str
    place: str
    candidates: tuple[str, ...]
    places: tuple[str, ...]
    trails: Mapping[str, tuple[str, ...]]
    turns: int

    @property
    def key(self) -> str:
        """The candidate who was where the object was lost: the start of the true trail."""
        return self.candidates[self.places.index(self.place)]

    @property
    def holder(self) -> str:
        """Who holds the object: the end of the true trail."""
        return self.trails[self.key][-1]

    def info(self) -> dict:
        """The world as JSON values (a row's ``extra_info``)."""
        return {
            "turns": self.turns,
            "object": self.object,
            "place": self.place,
            "candidates": list(self.candidates),
            "places": list(self.places),
            "trails": {c: list(t) for c, t in self.trails.items()},
        }

    @staticmethod
    def from_info(info: Mapping) -> World:
        """The world of a row's ``extra_info`` (ValueError naming the field when it is not one)."""
        try:
            world = World(
                str(info["object"]),
                str(info["place"]),
                tuple(map(str, info["candidates"])),
                tuple(map(str, info["places"])),
                {str(c): tuple(map(str, t)) for c, t in dict(info["trails"]).items()},
                int(info["turns"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"extra_info is not a trail world ({type(err).__name__}: {err})"
            ) from None
        ok = (
            len(world.candidates) == len(world.places)
            and world.place in world.places
            and set(world.trails) == set(world.candidates)
            and all(len(t) == world.turns - 1 for t in world.trails.values())
        )
        if not ok:
            raise ValueError(f"extra_info is not a consistent trail world of {world.turns} turns")
        return world


def make_world(turns: int, rng: random.Random) -> World:
    """A random world of a game of ``turns`` turns (every name in it distinct)."""
    if turns < 2:
        raise ValueError(f"a trail game needs >= 2 turns, got {turns}")
    need = CANDIDATES * turns
    if need > len(PEOPLE):
        raise ValueError(f"{turns} turns need {need} distinct people; there are {len(PEOPLE)}")
    people = rng.sample(PEOPLE, need)
    candidates = tuple(people[:CANDIDATES])
    rest = people[CANDIDATES:]
    trails = {
        c: tuple(rest[j * (turns - 1) : (j + 1) * (turns - 1)]) for j, c in enumerate(candidates)
    }
    places = tuple(rng.sample(PLACES, CANDIDATES))
    return World(rng.choice(OBJECTS), rng.choice(places), candidates, places, trails, turns)


def prompt_text(world: World) -> str:
    """The user's message: what was lost where, and the three candidates: the one who was there
    found it, the others are elsewhere."""
    where = [
        f"my {c} found it" if p == world.place else f"my {c} is at the {p}"
        for c, p in zip(world.candidates, world.places, strict=True)
    ]
    listed = ", ".join(where[:-1]) + " and " + where[-1]
    return f"I lost {world.object} at the {world.place}. {listed[0].upper()}{listed[1:]}."


def call_text(person: str) -> str:
    """The action that phones ``person`` (as the policy writes it, after the ``>`` prompt)."""
    return f" call my {person}"


def answer_text(person: str, obj: str) -> str:
    """The action that answers: ``person`` holds ``obj``."""
    return f" my {person} has {obj}"


def parse_action(text: str) -> tuple[str, str | None]:
    """``("call", person)`` for ``call my X``, ``("answer", person)`` for ``my X has ...`` (the
    first person before ``has``), else ``("other", None)``; person None when no known name."""
    words = _WORD.findall(text.lower())
    if words and words[0] == "call":
        return "call", next((w for w in words[1:] if w in _PEOPLE), None)
    if "has" in words:
        before = words[: words.index("has")]
        return "answer", next((w for w in before if w in _PEOPLE), None)
    return "other", None


class TrailGame:
    """The state of one game: which trail the agent is on and how far (see the module doc)."""

    def __init__(self, world: World, step_reward: float = 0.0):
        self.world, self.step_reward = world, float(step_reward)
        self.trail: tuple[str, ...] | None = None  # the names after the candidate called
        self.revealed = 0  # names of the trail told so far
        self.turn = 0

    def callable(self) -> set[str]:
        """Who answers a call with a name now: a candidate (no trail yet), or the last name told
        (not the holder)."""
        if self.trail is None:
            return set(self.world.candidates)
        if self.revealed < len(self.trail):
            return {self.trail[self.revealed - 1]}
        return set()

    def step(self, action: str) -> tuple[str | None, float, bool]:
        """(the reply, or None when the game ends; the reward; done)."""
        self.turn += 1
        kind, person = parse_action(action)
        if kind == "answer" or self.turn >= self.world.turns:
            right = kind == "answer" and person == self.world.holder
            return None, 1.0 if right else 0.0, True
        if kind != "call" or person is None:
            return DONT_KNOW, 0.0, False
        if person not in self.callable():
            return f"my {person}: {DONT_KNOW}", 0.0, False
        if self.trail is None:
            self.trail = self.world.trails[person]
        name = self.trail[self.revealed]
        self.revealed += 1
        if self.revealed == len(self.trail):
            reply = f"my {person}: my {name} has {self.world.object}."
        else:
            reply = f"my {person}: call my {name}."
        return reply, self.step_reward, False


def gold(world: World, messages: Sequence[Mapping]) -> float:
    """Gold score of a conversation: 1.0 when its last assistant message answers with the holder of
    the true trail, else 0.0."""
    actions = [m["content"] for m in messages if m.get("role") == "assistant"]
    if not actions:
        return 0.0
    kind, person = parse_action(actions[-1])
    return 1.0 if kind == "answer" and person == world.holder else 0.0


def first_call(messages: Sequence[Mapping]) -> str | None:
    """Whom the first assistant message calls (None: it is no call of a known name)."""
    actions = [m["content"] for m in messages if m.get("role") == "assistant"]
    kind, person = parse_action(actions[0]) if actions else ("other", None)
    return person if kind == "call" else None


def play(world: World, first: str) -> list[dict]:
    """The conversation of a game whose first call is ``first`` and whose later turns follow the
    trail faithfully and answer with its holder."""
    game = TrailGame(world)
    messages = [{"role": "user", "content": prompt_text(world)}]
    action = call_text(first)
    for _ in range(world.turns):
        reply, _, done = game.step(action)
        messages.append({"role": "assistant", "content": action})
        if done:
            break
        messages.append({"role": "user", "content": reply})
        kind, person = parse_action(reply.split(":", 1)[1])
        action = call_text(person) if kind == "call" else answer_text(person, world.object)
    return messages


def rows(turns: int, n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """``n`` prompt rows of ``marlhf-trail-{turns}`` in SkyRL's dataset format. Deterministic in
    all arguments."""
    if turns not in TURNS:
        raise ValueError(f"the trail task has {TURNS} turns, got {turns}")
    rng = random.Random(f"trail/{turns}/{seed}/{split}")
    out = []
    for i in range(n):
        world = make_world(turns, rng)
        out.append(
            {
                "id": f"trail{turns}-{split}-{i:06d}",
                "data_source": f"marlhf-trail-v{TRAIL_VERSION}",
                "prompt": [{"role": "user", "content": prompt_text(world)}],
                "env_class": f"marlhf-trail-{turns}",
                "reward_spec": {"method": "rule", "ground_truth": world.holder},
                "extra_info": world.info(),
            }
        )
    return out


def pretraining_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """``n`` played games, of 2, 4 and 8 turns in turn: the corpus of ``tiny-base-trail`` (module
    doc). The random stream (``"trail-pretrain/{seed}"``) is not the one of :func:`rows`."""
    rng = random.Random(f"trail-pretrain/{seed}")
    out = []
    for i in range(n):
        world = make_world(TURNS[i % len(TURNS)], rng)
        first = world.key
        if rng.random() < PRETRAIN_WRONG_FIRST:
            first = rng.choice([c for c in world.candidates if c != world.key])
        out.append(play(world, first))
    return out
