"""Prompts through the tokenizer's own chat template (``--apply_chat_template``).

A dataset's prompt becomes a list of messages (``{"role": "user" | "assistant" | "system",
"content": str}``), rendered by ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``:

- rows that carry messages (a ``messages`` list, or a ``prompt`` given as a list of messages;
  `marlhf.data.adapters`) keep them;
- HH-style prompts (``"\\n\\nHuman: ...\\n\\nAssistant: ...\\n\\nHuman: ...\\n\\nAssistant:"``, and
  WebGPT's ``" Human: ... Assistant:"``) are split into their turns;
- any other prompt (TL;DR's ``POST ... TL;DR: ``, APPS) is one user message.

The responses are the assistant's answer: their leading whitespace (HH's answers start with a space
after ``Assistant:``) is dropped, and the end-of-conversation token still follows them.

A template the tokenizer cannot spell (markers such as ``<|user|>`` that encode to its unknown
token, or that its decoding loses: another model's template, a tokenizer without those pieces) is
refused before any prompt is rendered (:func:`check_spelling`): the model would read ``<unk>``
where the turns are.

>>> hh_messages("\\n\\nHuman: Hi there\\n\\nAssistant: Hello!\\n\\nHuman: How are you?\\n\\nAssistant:")
[{'role': 'user', 'content': 'Hi there'}, {'role': 'assistant', 'content': 'Hello!'}, {'role': 'user', 'content': 'How are you?'}]
>>> hh_messages("POST\\nSubreddit: r/cats\\nTL;DR: ") is None
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import weakref
from collections.abc import Sequence
from typing import Any

from marlhf.data.schema import DataError, Example

ROLES = ("system", "user", "assistant")
_TURN = re.compile(r"\n\n(Human|Assistant):")  # HH's turns
_WEBGPT = re.compile(r"^ Human: (.*) Assistant:$", re.S)  # one question


def hh_messages(prompt: str) -> list[dict] | None:
    """The turns of an HH-style prompt, ending with the user's; None when ``prompt`` has no
    ``Human:`` turn followed by a final empty ``Assistant:``."""
    one = _WEBGPT.match(prompt)
    if one is not None and "\n\nHuman:" not in prompt:
        return [{"role": "user", "content": one.group(1).strip()}]
    marks = list(_TURN.finditer(prompt))
    if not marks or marks[0].group(1) != "Human" or marks[-1].group(1) != "Assistant":
        return None
    if prompt[marks[-1].end() :].strip() or prompt[: marks[0].start()].strip():
        return None
    out = []
    for m, nxt in zip(marks[:-1], marks[1:], strict=True):
        role = "user" if m.group(1) == "Human" else "assistant"
        out.append({"role": role, "content": prompt[m.end() : nxt.start()].strip()})
    return out


def check_messages(messages: Any, where: str, field: str = "messages") -> list[dict]:
    """``messages`` as a list of ``{"role", "content"}`` dicts (DataError naming the field else)."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f'{where}: field "{field}" must be a non-empty list of messages')
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise DataError(f'{where}: field "{field}[{i}].role" must be one of {ROLES}')
        if not isinstance(m.get("content"), str):
            raise DataError(f'{where}: field "{field}[{i}].content" must be a string')
        out.append({"role": m["role"], "content": m["content"]})
    return out


def as_text(messages: Sequence[dict]) -> str:
    """The HH-style plain text of a prompt given as messages (what runs without a chat template)."""
    names = {"user": "Human", "assistant": "Assistant", "system": "System"}
    turns = "".join(f"\n\n{names[m['role']]}: {m['content']}" for m in messages)
    return turns + "\n\nAssistant:"


def prompt_messages(example: Example) -> list[dict]:
    """The messages of ``example``'s prompt (see the module doc)."""
    if example.meta.get("messages"):
        return list(example.meta["messages"])
    return hh_messages(example.prompt) or [{"role": "user", "content": example.prompt}]


def require_template(tokenizer: Any) -> str:
    """The tokenizer's chat template (ValueError naming the tokenizer when it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"--apply_chat_template: the tokenizer of {name} has no chat_template (set one in "
            "its tokenizer_config.json or chat_template.jinja, or leave the flag off)"
        )
    return template if isinstance(template, str) else repr(template)


# what a template is probed with: two turns of each role, words any tokenizer spells
_PROBE = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi"},
    {"role": "user", "content": "Thanks"},
]
# tokenizer -> the templates it spells (checked once each)
_SPELLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _no_space(text: str) -> str:
    return re.sub(r"\s+", "", text)


def spelling_problem(tokenizer: Any) -> str | None:
    """Why the tokenizer cannot spell what its chat template renders, or None: a probe conversation
    is rendered and encoded; its unknown tokens, or a marker of the template (the text around the
    messages) missing from the decoded ids, mean the model would read ``<unk>`` or nothing there."""
    text = _render(tokenizer, _PROBE)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    markers, rest = [], text
    for m in _PROBE:
        head, _, rest = rest.partition(m["content"])
        markers.append(head)
    markers = [_no_space(m) for m in (*markers, rest) if _no_space(m)]
    unk = getattr(tokenizer, "unk_token_id", None)
    n_unk = sum(i == unk for i in ids) if unk is not None else 0
    decoded = _no_space(tokenizer.decode(ids, skip_special_tokens=False))
    lost = [m for m in markers if m not in decoded]
    if not n_unk and not lost:
        return None
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    what = (
        f"{n_unk} of its {len(ids)} tokens are the unknown token {tokenizer.unk_token!r}"
        if n_unk
        else f"the markers {lost} do not survive encoding and decoding"
    )
    return (
        f"--apply_chat_template: the tokenizer of {name} cannot spell its chat template's "
        f"markers: a probe conversation renders to {text!r}, and {what}. The model would read "
        "no turns. Use a template written in this tokenizer's vocabulary (the model's own), "
        "or leave the flag off"
    )


def check_spelling(tokenizer: Any) -> None:
    """Raise ``ValueError`` with :func:`spelling_problem`'s line (once per tokenizer and
    template: a stage renders thousands of prompts)."""
    template = require_template(tokenizer)
    try:
        done = _SPELLED.setdefault(tokenizer, set())
    except TypeError:  # not weakly referable: checked each time
        done = set()
    if template in done:
        return
    problem = spelling_problem(tokenizer)
    if problem is not None:
        raise ValueError(problem)
    done.add(template)


def template_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of the chat template (part of the tokenised-data cache key)."""
    return hashlib.sha256(require_template(tokenizer).encode("utf-8")).hexdigest()


def render_prompt(tokenizer: Any, messages: Sequence[dict]) -> str:
    """The prompt text the template makes for ``messages``, up to where the assistant answers. A
    leading BOS text is dropped: the stages put the BOS token in front themselves. ValueError
    when the tokenizer has no template or cannot spell it (:func:`check_spelling`)."""
    check_spelling(tokenizer)
    return _render(tokenizer, messages)


def _render(tokenizer: Any, messages: Sequence[dict]) -> str:
    require_template(tokenizer)
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        text = text[len(bos) :]
    return text


def chat_examples(examples: Sequence[Example], tokenizer: Any) -> list[Example]:
    """``examples`` with their prompts rendered by the chat template and the responses' leading
    whitespace dropped; the plain prompt is kept in ``meta["plain_prompt"]`` (gold scorers and
    reports read the task's own text)."""
    out = []
    for e in examples:
        out.append(
            dataclasses.replace(
                e,
                prompt=render_prompt(tokenizer, prompt_messages(e)),
                chosen=None if e.chosen is None else e.chosen.lstrip(),
                rejected=None if e.rejected is None else e.rejected.lstrip(),
                meta={**e.meta, "plain_prompt": e.prompt},
            )
        )
    return out
