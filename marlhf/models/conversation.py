"""A multi-turn conversation in tokens, built piece by piece as it is played, so a generator only
ever reads the new tokens.

A conversation is the first prompt (messages, rendered with the chat template and its generation
prompt), then turns: the policy's action (the tokens it sampled, ending with the end-of-turn token
when it stopped there) and the environment's observations. After each action the only new tokens
are the *context* the template puts after it: what follows its end-of-turn token (``\\n`` in
ChatML), the observations' messages and the next generation prompt::

    [ prompt ......................][ action 1 ......][ context 1 ................][ action 2 ........]
    <bos>I lost my keys ... cafe.\\n> call my boss<eos>\\nmy boss: call my cousin.\\n> call my cousin<eos>

Concatenated, the pieces are the tokenisation of the whole conversation rendered at once (up to
its last end-of-turn token) whenever each action's tokens are the tokenisation of its text: that
holds when the template only appends (*prefix-stable*). :meth:`ChatLayout.context` checks it at
every turn (the conversation rendered before the action, with the action, and with the
observations, each must start with the one before) and raises :class:`TemplateError` when a
template renders earlier turns again differently (templates that drop earlier reasoning, or whose
generation prompt is not how they start an assistant message). An action cut at the length limit
(no end-of-turn token) gets the template's end-of-turn token as context, not as an action.

The tensors (:func:`pad_conversations`) keep the project's split between prompt and response: the
prompt is left-padded ``(B, P)``, the *response* is everything after the first prompt, actions and
observations interleaved, right-padded ``(B, A)``. ``response_mask`` is true on its tokens,
``action_mask`` only on the policy's (a prefix of the row no longer: it has holes where the
observations are), ``turn_index`` numbers the turns (1, 2, ...; an action and the context after it
share a number; 0 on padding), and ``turn_end`` marks each turn's last action token, where a
per-turn reward goes. Observation tokens are context: no policy loss, no KL, no entropy on them.

Only a tokenizer is needed here (torch for :func:`pad_conversations`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class TemplateError(ValueError):
    """A chat template cannot lay out a conversation turn by turn (one line naming it)."""


@dataclass
class ConversationTokens:
    """One conversation in tokens. ``token_ids``, ``action_mask`` and ``turn_index`` have one entry
    per token (``turn_index`` 0 on the first prompt, ``k`` on the ``k``-th action and the context
    after it); ``turn_ends``: the position of each turn's last action token; ``prompt_len``: the
    first prompt's tokens."""

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    prompt_len: int = 0

    def extend(self, ids: Sequence[int], action: bool, turn: int) -> None:
        self.token_ids.extend(ids)
        self.action_mask.extend([action] * len(ids))
        self.turn_index.extend([turn] * len(ids))


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


class ChatLayout:
    """How a tokenizer's chat template lays out a conversation piece by piece (module doc).

    Args:
        tokenizer: a Hugging Face tokenizer.
        end_of_turn: the token the policy ends a turn with (default: the tokenizer's eos token;
            ``<|im_end|>`` for ChatML models whose eos differs).
        chat_template: a template to use instead of the tokenizer's own.
    """

    def __init__(
        self, tokenizer: Any, end_of_turn: int | None = None, chat_template: str | None = None
    ):
        self.tokenizer = tokenizer
        self.template = chat_template
        self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"the tokenizer of {self.name} has no chat template")
        self.end_of_turn = tokenizer.eos_token_id if end_of_turn is None else end_of_turn
        if self.end_of_turn is None:
            raise TemplateError(f"the tokenizer of {self.name} has no eos token; give end_of_turn")

    def render(self, messages: Sequence[dict], generation_prompt: bool) -> list[int]:
        """The tokens of ``messages`` rendered at once (what ``apply_chat_template(...,
        tokenize=True)`` gives)."""
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=generation_prompt,
                chat_template=self.template,
            )
        except Exception as err:  # noqa: BLE001 - a template's own error (jinja's raise_exception)
            raise TemplateError(
                f"the chat template of {self.name} cannot render the conversation: "
                f"{type(err).__name__}: {err}"
            ) from None
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt(self, messages: Sequence[dict]) -> list[int]:
        """The first piece: ``messages`` with the generation prompt."""
        return self.render(messages, True)

    def _check_prefix(self, shorter: list[int], longer: list[int], turn: int, what: str) -> None:
        if longer[: len(shorter)] != shorter:
            i = _first_difference(shorter, longer)
            raise TemplateError(
                f"the chat template of {self.name} is not prefix-stable: {what} of turn {turn} "
                f"changes the tokens before it (from token {i}: "
                f"{self.tokenizer.decode(shorter[i : i + 8])!r} becomes "
                f"{self.tokenizer.decode(longer[i : i + 8])!r}); multi-turn rollouts need a "
                "template that only appends"
            )

    def context(
        self,
        before: Sequence[dict],
        action: str,
        observations: Sequence[dict],
        ended: bool = True,
        turn: int = 1,
        before_ids: list[int] | None = None,
    ) -> list[int]:
        """The context tokens after an action: the end-of-turn token when the action was cut
        (``ended`` false), what the template puts after the end-of-turn token, the
        ``observations`` and the next generation prompt.

        Args:
            before: the conversation before the action (the first prompt and the turns so far).
            action: the action's text (without the end-of-turn token).
            observations: the environment's messages after it (possibly none).
            turn: the action's turn (1, 2, ...), for errors.
            before_ids: ``render(before, True)`` if the caller has it, else it is rendered here.
        """
        return self.context_and_render(before, action, observations, ended, turn, before_ids)[0]

    def context_and_render(
        self,
        before: Sequence[dict],
        action: str,
        observations: Sequence[dict],
        ended: bool = True,
        turn: int = 1,
        before_ids: list[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        """``(context(...), render(before + action + observations, True))``: the second is the
        ``before_ids`` of the next turn's call, so a conversation is rendered once per turn."""
        assistant = {"role": "assistant", "content": action}
        a = self.render(before, True) if before_ids is None else before_ids
        b = self.render([*before, assistant], False)
        c = self.render([*before, assistant, *observations], True)
        self._check_prefix(a, b, turn, "rendering the answer")
        self._check_prefix(b, c, turn, "rendering the observations")
        answer = b[len(a) :]
        ends = [i for i, t in enumerate(answer) if t == self.end_of_turn]
        if not ends:
            raise TemplateError(
                f"the chat template of {self.name} does not end an assistant message with the "
                f"end-of-turn token {self.tokenizer.convert_ids_to_tokens(self.end_of_turn)!r} "
                f"(it renders {self.tokenizer.decode(answer[-8:])!r}); give the token it uses"
            )
        glue = answer[ends[-1] + 1 :]
        return ([] if ended else [self.end_of_turn]) + glue + c[len(b) :], c

    def build(
        self,
        prompt: Sequence[dict],
        actions: Sequence[tuple[str, Sequence[int]]],
        observations: Sequence[Sequence[dict]],
    ) -> ConversationTokens:
        """The tokens of a finished conversation: ``prompt``, then for each turn ``k`` the action
        ``actions[k] = (text, sampled ids)`` and, before the next action, the context of
        ``observations[k]`` (the last turn's observations are not laid out: nothing follows)."""
        if len(observations) not in (len(actions), len(actions) - 1):
            raise ValueError(f"{len(actions)} actions need as many observation lists")
        out = ConversationTokens()
        ids = self.prompt(prompt)
        out.extend(ids, False, 0)
        out.prompt_len = len(ids)
        messages = list(prompt)
        for k, (text, action_ids) in enumerate(actions, start=1):
            out.extend(list(action_ids), True, k)
            out.turn_ends.append(len(out.token_ids) - 1)
            if k == len(actions):
                break
            ended = bool(action_ids) and action_ids[-1] == self.end_of_turn
            piece, ids = self.context_and_render(messages, text, observations[k - 1], ended, k, ids)
            out.extend(piece, False, k)
            messages += [{"role": "assistant", "content": text}, *observations[k - 1]]
        return out


def pad_conversations(convs: Sequence[ConversationTokens], pad_id: int) -> dict[str, torch.Tensor]:
    """The batch tensors of conversations (module doc): ``prompt_ids``, ``prompt_mask`` ``(B, P)``
    left-padded; ``response_ids``, ``response_mask``, ``action_mask``, ``turn_end`` ``(B, A)`` and
    ``turn_index`` ``(B, A)`` long, right-padded (``A`` the longest response)."""
    B = len(convs)
    P = max((c.prompt_len for c in convs), default=0)
    A = max((len(c.token_ids) - c.prompt_len for c in convs), default=0)
    out = {
        "prompt_ids": torch.full((B, P), pad_id, dtype=torch.long),
        "prompt_mask": torch.zeros(B, P, dtype=torch.bool),
        "response_ids": torch.full((B, A), pad_id, dtype=torch.long),
        "response_mask": torch.zeros(B, A, dtype=torch.bool),
        "action_mask": torch.zeros(B, A, dtype=torch.bool),
        "turn_index": torch.zeros(B, A, dtype=torch.long),
        "turn_end": torch.zeros(B, A, dtype=torch.bool),
    }
    for i, c in enumerate(convs):
        p, n = c.prompt_len, len(c.token_ids) - c.prompt_len
        out["prompt_ids"][i, P - p :] = torch.tensor(c.token_ids[:p], dtype=torch.long)
        out["prompt_mask"][i, P - p :] = True
        out["response_ids"][i, :n] = torch.tensor(c.token_ids[p:], dtype=torch.long)
        out["response_mask"][i, :n] = True
        out["action_mask"][i, :n] = torch.tensor(c.action_mask[p:], dtype=torch.bool)
        out["turn_index"][i, :n] = torch.tensor(c.turn_index[p:], dtype=torch.long)
        for t in c.turn_ends:
            out["turn_end"][i, t - p] = True
    return out
