"""The conversation token layout against the independent reference, the whole conversation rendered
at once by the tokenizer's chat template: the pieces concatenate to it (the trail task's template
on the tiny tokenizer; ChatML and a Llama-3-style template on a tiny tokenizer with their special
tokens), masks and turn ends where the actions are, cut actions, templates that are not
prefix-stable, and the batch tensors."""

from __future__ import annotations

import random

import pytest
import torch

from marlhf.data import trail
from marlhf.models.conversation import ChatLayout, TemplateError, pad_conversations
from marlhf.models.zoo import ensure_tiny_base

# Qwen2.5's ChatML template (its default system prompt included), as the models ship it.
CHATML = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Llama 3's layout: nothing between a turn's end and the next header.
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
# Earlier answers lose their reasoning (as Qwen3's template does): not prefix-stable.
DROPS_REASONING = CHATML.replace(
    "message['content'] + '<|im_end|>'",
    "(message['content'].split('</think>')[-1] if message['role'] == 'assistant' and not loop.last "
    "else message['content']) + '<|im_end|>'",
)
# The generation prompt opens a reasoning block the rendered answers do not have.
THINKING_PROMPT = CHATML.replace(
    "'<|im_start|>assistant\\n' }}{%- endif %}",
    "'<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
)


@pytest.fixture(scope="module")
def tiny_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_base())


@pytest.fixture(scope="module")
def special_tok():
    """The tiny tokenizer with ChatML's and Llama 3's special tokens added."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tiny_base())
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>",
            ]
        }
    )  # fmt: skip
    return tok


def whole(tok, messages, template):
    """The reference: the conversation rendered and tokenised at once by transformers."""
    out = tok.apply_chat_template(messages, tokenize=True, chat_template=template)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def split_turns(messages):
    """(first prompt, [(action text, observations after it)]) of a conversation."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    turns = []
    for m in messages[first:]:
        if m["role"] == "assistant":
            turns.append((m["content"], []))
        else:
            turns[-1][1].append(m)
    return messages[:first], turns


def layout(tok, messages, template, eot, cut=()):
    """Build with each action's canonical tokens (its text tokenised, then the end-of-turn token,
    except for the turns in ``cut``)."""
    prompt, turns = split_turns(messages)
    actions = []
    for k, (text, _) in enumerate(turns):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        actions.append((text, ids if k in cut else ids + [eot]))
    lay = ChatLayout(tok, end_of_turn=eot, chat_template=template)
    return lay.build(prompt, actions, [obs for _, obs in turns]), actions


def random_trail_game(rng: random.Random) -> list[dict]:
    """A trail game played by a random policy: right and wrong calls, dead ends, malformed turns."""
    world = trail.make_world(rng.choice(trail.TURNS), rng)
    game = trail.TrailGame(world)
    messages = [{"role": "user", "content": trail.prompt_text(world)}]
    while True:
        pool = sorted(game.callable()) or list(world.candidates)
        action = rng.choice(
            [trail.call_text(rng.choice(pool)), trail.call_text(rng.choice(trail.PEOPLE)),
             " hello there", trail.answer_text(rng.choice(trail.PEOPLE), world.object)]
        )  # fmt: skip
        reply, _, done = game.step(action)
        messages.append({"role": "assistant", "content": action})
        if done:
            return messages
        messages.append({"role": "user", "content": reply})


def test_trail_games_lay_out_as_the_whole_conversation_rendered_at_once(tiny_tok):
    rng = random.Random(3)
    for _ in range(30):
        messages = random_trail_game(rng)
        conv, actions = layout(tiny_tok, messages, trail.CHAT_TEMPLATE, tiny_tok.eos_token_id)
        ref = whole(tiny_tok, messages, trail.CHAT_TEMPLATE)
        # the reference ends with the template's newline after the last <eos>: nothing follows it
        assert ref[-1] == tiny_tok("\n", add_special_tokens=False)["input_ids"][0]
        assert conv.token_ids == ref[:-1]
        assert conv.prompt_len == len(whole_prompt(tiny_tok, messages[:1], trail.CHAT_TEMPLATE))
        check_masks(tiny_tok, conv, actions)


def whole_prompt(tok, messages, template):
    out = tok.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, chat_template=template
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def check_masks(tok, conv, actions):
    """Action tokens are exactly each action's ids, in turn order, ending at ``turn_ends``."""
    n = len(conv.token_ids)
    assert len(conv.action_mask) == len(conv.turn_index) == n
    for k, (_, ids) in enumerate(actions, start=1):
        pos = [i for i in range(n) if conv.action_mask[i] and conv.turn_index[i] == k]
        assert [conv.token_ids[i] for i in pos] == ids
        assert pos == list(range(pos[0], pos[0] + len(ids)))  # one contiguous span
        assert conv.turn_ends[k - 1] == pos[-1]
    assert not any(conv.action_mask[: conv.prompt_len]) and set(
        conv.turn_index[: conv.prompt_len]
    ) == {0}
    assert sorted(set(conv.turn_index)) == list(range(len(actions) + 1))


def test_chatml_with_several_and_no_observations(special_tok):
    eot = special_tok.convert_tokens_to_ids("<|im_end|>")
    messages = [
        {"role": "user", "content": "My cat ate a sock."},
        {"role": "assistant", "content": "Call the vet."},
        {"role": "tool", "content": "The vet is busy."},
        {"role": "user", "content": "What now?"},
        {"role": "assistant", "content": "Wait an hour."},  # no observation after this turn
        {"role": "assistant", "content": "Then call again."},
        {"role": "user", "content": "Done."},
        {"role": "assistant", "content": "Good."},
    ]
    conv, actions = layout(special_tok, messages, CHATML, eot)
    ref = whole(special_tok, messages, CHATML)
    assert conv.token_ids == ref[:-1]  # ChatML's "\n" after the last <|im_end|> follows nothing
    check_masks(special_tok, conv, actions)
    # the context after an action starts with the "\n" ChatML puts after <|im_end|>
    first_end = conv.turn_ends[0]
    assert special_tok.decode(conv.token_ids[first_end + 1 : first_end + 3]) == "\n<|im_start|>"


def test_llama3_style_template_without_glue(special_tok):
    eot = special_tok.convert_tokens_to_ids("<|eot_id|>")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "My dog bit the mailman."},
        {"role": "assistant", "content": "Apologise."},
        {"role": "user", "content": "He is angry."},
        {"role": "assistant", "content": "Bring a cake."},
    ]
    conv, actions = layout(special_tok, messages, LLAMA3, eot)
    assert conv.token_ids == whole(special_tok, messages, LLAMA3)
    check_masks(special_tok, conv, actions)


def test_a_cut_action_gets_the_end_of_turn_token_as_context(tiny_tok):
    messages = random_trail_game(random.Random(5))
    eos = tiny_tok.eos_token_id
    conv, actions = layout(tiny_tok, messages, trail.CHAT_TEMPLATE, eos, cut={0})
    assert conv.token_ids == whole(tiny_tok, messages, trail.CHAT_TEMPLATE)[:-1]
    end = conv.turn_ends[0]
    assert conv.token_ids[end + 1] == eos and not conv.action_mask[end + 1]
    assert conv.turn_index[end + 1] == 1
    check_masks(tiny_tok, conv, actions)


def test_sampled_tokens_that_are_not_the_canonical_ones_are_kept(tiny_tok):
    """The actions' tokens are what the policy sampled, even when re-tokenising their text would
    merge them differently; the context is the same."""
    messages = random_trail_game(random.Random(6))
    prompt, turns = split_turns(messages)
    eos = tiny_tok.eos_token_id
    lay = ChatLayout(tiny_tok, chat_template=trail.CHAT_TEMPLATE)
    spelled = [  # each action spelled one character at a time
        (t, [i for ch in t for i in tiny_tok(ch, add_special_tokens=False)["input_ids"]] + [eos])
        for t, _ in turns
    ]
    canonical = [(t, tiny_tok(t, add_special_tokens=False)["input_ids"] + [eos]) for t, _ in turns]
    obs = [o for _, o in turns]
    a, b = lay.build(prompt, spelled, obs), lay.build(prompt, canonical, obs)
    assert [x for x, m in zip(a.token_ids, a.action_mask, strict=True) if m] == sum(
        (ids for _, ids in spelled), []
    )
    ctx_a = [x for x, m in zip(a.token_ids, a.action_mask, strict=True) if not m]
    ctx_b = [x for x, m in zip(b.token_ids, b.action_mask, strict=True) if not m]
    assert ctx_a == ctx_b


@pytest.mark.parametrize(
    ("template", "says"),
    [
        (DROPS_REASONING, "rendering the observations of turn 1 changes the tokens before it"),
        (THINKING_PROMPT, "rendering the answer of turn 1 changes the tokens before it"),
    ],
)
def test_a_template_that_is_not_prefix_stable_is_refused(special_tok, template, says):
    eot = special_tok.convert_tokens_to_ids("<|im_end|>")
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>hm</think>Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "<think>ok</think>Bye"},
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "!"},
    ]
    with pytest.raises(TemplateError) as info:
        layout(special_tok, messages, template, eot)
    assert "is not prefix-stable" in str(info.value) and says in str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_a_template_that_does_not_end_turns_with_the_token_is_refused(tiny_tok):
    template = trail.CHAT_TEMPLATE.replace("{{ eos_token }}", "")
    world = trail.make_world(4, random.Random(7))
    messages = trail.play(world, world.key)
    with pytest.raises(
        TemplateError, match=r"does not end an assistant message with the end-of-turn token '<eos>'"
    ):
        layout(tiny_tok, messages, template, tiny_tok.eos_token_id)
    with pytest.raises(TemplateError, match=r"has no chat template"):
        ChatLayout(tiny_tok)


def test_batch_tensors(tiny_tok):
    rng = random.Random(8)
    convs = [
        layout(tiny_tok, random_trail_game(rng), trail.CHAT_TEMPLATE, tiny_tok.eos_token_id)[0]
        for _ in range(3)
    ]
    t = pad_conversations(convs, pad_id=0)
    B, A = t["response_ids"].shape
    assert B == 3 and A == max(len(c.token_ids) - c.prompt_len for c in convs)
    for i, c in enumerate(convs):
        p, n = c.prompt_len, len(c.token_ids) - c.prompt_len
        assert t["prompt_ids"][i][t["prompt_mask"][i]].tolist() == c.token_ids[:p]
        assert t["prompt_mask"][i, -p:].all()  # left-padded
        assert t["response_mask"][i].tolist() == [True] * n + [False] * (A - n)
        assert t["response_ids"][i, :n].tolist() == c.token_ids[p:]
        assert (
            t["action_mask"][i, :n].tolist() == c.action_mask[p:]
            and not t["action_mask"][i, n:].any()
        )
        ends = torch.nonzero(t["turn_end"][i]).flatten().tolist()
        assert ends == [e - p for e in c.turn_ends]
        assert (
            t["turn_index"][i, :n].tolist() == c.turn_index[p:] and not t["turn_index"][i, n:].any()
        )
