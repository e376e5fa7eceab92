"""The macro actions of multi-turn result rows (``marlhf infer --env``) for ``marlhf view``.

A row's policy turns are cut as a multi-turn rollout is in training: their tokens side by side (the
saved ``token_ids``, else each turn's text re-tokenised, with the eos when it ``ends_with_eos``),
each turn's last token a macro-action boundary (``turn_end`` of
:func:`marlhf.macro.termination_inputs`), so a macro action never spans an observation. A rule
that reads the policy (``ppl``, ``entropy``, ``lowprob``) gets its quantities at each action token
where it sits in the whole conversation (:meth:`marlhf.models.conversation.ChatLayout.build`: the
first prompt and the observations rendered with the policy's chat template between the actions).
"""

from __future__ import annotations

from typing import Any

import torch

from marlhf.inference.macro_view import POLICY_INPUTS
from marlhf.inference.models import Models
from marlhf.macro import termination_inputs
from marlhf.macro.render import token_pieces
from marlhf.models.conversation import ChatLayout, TemplateError

ROLES = ("policy", "observation")


def check_turns(row: dict, where: str) -> None:
    """ValueError naming the line and field of a ``turns`` value of the wrong form."""
    turns = row["turns"]
    if not isinstance(turns, list):
        raise ValueError(f'{where}: field "turns" must be a list, got {type(turns).__name__}')
    for k, t in enumerate(turns):
        at = f'{where}: field "turns"[{k}]'
        if not isinstance(t, dict) or t.get("role") not in ROLES:
            raise ValueError(f'{at} must be an object whose "role" is policy or observation')
        if not isinstance(t.get("text"), str):
            raise ValueError(f"{at}.text must be a string, got {type(t.get('text')).__name__}")
        reward = t.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise ValueError(f"{at}.reward must be a number or null, got {reward!r:.40}")
        ids = t.get("token_ids")
        if ids is not None and not (
            isinstance(ids, list)
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise ValueError(f"{at}.token_ids must be a list of token ids")


def _action_ids(tok: Any, turn: dict, where: str) -> list[int]:
    """A policy turn's tokens: its saved ids, else its text re-tokenised (+ eos when it ended)."""
    ids = turn.get("token_ids")
    if ids is not None:
        if any(i >= len(tok) for i in ids):
            raise ValueError(
                f'{where}: field "token_ids" holds id {max(ids)}, outside the vocabulary of '
                f"{len(tok)} tokens (a file of another model? pass --model)"
            )
        return list(ids)
    ids = tok(turn["text"], add_special_tokens=False)["input_ids"]
    if turn.get("ends_with_eos") is True and tok.eos_token_id is not None:
        ids = ids + [tok.eos_token_id]
    return ids


def action_logprobs_and_entropy(
    models: Models, row: dict, actions: list[list[int]], temperature: float, A: int, where: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy) (A,) float of the row's action tokens ``actions`` (each policy turn's
    ids), side by side and zero after them, from the policy reading the whole conversation
    (module doc), at ``temperature``. ``where``: the row's file and line, for errors."""
    try:
        layout = ChatLayout(models.tokenizer)
    except TemplateError as err:
        raise ValueError(
            f"{where}: {err}; the rule reads the policy over the conversation"
        ) from None
    prompt = row.get("prompt_messages") or [{"role": "user", "content": row.get("prompt") or ""}]
    texts, observations, current = [], [], None
    for t in row["turns"]:
        if t["role"] == "policy":
            texts.append(t["text"])
            current = []
            observations.append(current)
        elif current is not None:
            current.append({"role": t.get("message_role") or "user", "content": t["text"]})
    conv = layout.build(prompt, list(zip(texts, actions, strict=True)), observations)
    seq = torch.tensor([conv.token_ids], dtype=torch.long, device=models.device)
    logits = models.policy(input_ids=seq).logits.float()[0, :-1] / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    where_actions = [j for j, a in enumerate(conv.action_mask) if a]
    at = torch.tensor(where_actions, dtype=torch.long, device=logits.device) - 1
    tokens = seq[0, at + 1]
    logp = torch.zeros(A)
    ent = torch.zeros(A)
    n = len(where_actions)
    logp[:n] = logp_all[at].gather(-1, tokens[:, None])[:, 0].cpu()
    ent[:n] = -(logp_all[at].exp() * logp_all[at]).sum(-1).cpu()
    return logp, ent


@torch.no_grad()
def turn_items(
    rule: Any,
    models: Models,
    rows: list[dict],
    where: list[str],
    temperature: float,
    seed: int,
) -> list[dict]:
    """The view items of multi-turn rows (``rows[b]["turns"]``): each ``{"prompt", "reward",
    "turns", "pieces", "macro_end"}``, ``turns`` the row's turns with each policy turn's
    ``pieces`` and ``macro_end`` (its macro actions, ending at the turn's end), ``pieces`` and
    ``macro_end`` every policy turn's side by side. ``where``: each row's file and line."""
    tok = models.tokenizer
    actions = []
    for row, w in zip(rows, where, strict=True):
        policy = [t for t in row["turns"] if t["role"] == "policy"]
        actions.append([_action_ids(tok, t, w) for t in policy])
    A = max(max((sum(len(a) for a in acts) for acts in actions), default=1), 1)
    B = len(rows)
    response = torch.full((B, A), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(B, A, dtype=torch.bool)
    turn_end = torch.zeros(B, A, dtype=torch.bool)
    ends = torch.zeros(B, dtype=torch.bool)
    for b, acts in enumerate(actions):
        flat = [i for a in acts for i in a]
        response[b, : len(flat)] = torch.tensor(flat, dtype=torch.long)
        mask[b, : len(flat)] = True
        at = 0
        for a in acts:
            at += len(a)
            if a:
                turn_end[b, at - 1] = True
        ends[b] = bool(flat) and flat[-1] == tok.eos_token_id
    quantities: dict[str, torch.Tensor] = {}

    def policy(k: int) -> torch.Tensor:
        if not quantities:
            both = [
                action_logprobs_and_entropy(models, r, a, temperature, A, w)
                for r, a, w in zip(rows, actions, where, strict=True)
            ]
            quantities["logp"] = torch.stack([x[0] for x in both])
            quantities["entropy"] = torch.stack([x[1] for x in both])
        return quantities["logp" if k == 0 else "entropy"]

    if rule.needs & POLICY_INPUTS and models.policy is None:
        raise ValueError("the rule reads the policy, which is not loaded")
    inputs = termination_inputs(
        rule,
        response,
        mask,
        ends,
        ref_logprobs=lambda: policy(0),
        ref_entropy=lambda: policy(1),
        old_logprobs=lambda: policy(0),
        generator=torch.Generator().manual_seed(seed),
        turn_end=turn_end,
    )
    macro_end = rule(inputs).macro_end
    items = []
    for b, (row, acts) in enumerate(zip(rows, actions, strict=True)):
        turns, at, k = [], 0, 0
        all_pieces: list[str] = []
        for t in row["turns"]:
            if t["role"] != "policy":
                turns.append(
                    {
                        "role": "observation",
                        "text": t["text"],
                        "message_role": t.get("message_role"),
                    }
                )
                continue
            ids = acts[k]
            pieces = token_pieces(tok, ids)
            ends_b = macro_end[b, at : at + len(ids)].tolist()
            turns.append(
                {"role": "policy", "pieces": pieces, "macro_end": ends_b, "reward": t.get("reward")}
            )
            all_pieces += pieces
            at += len(ids)
            k += 1
        items.append(
            {
                "prompt": row.get("prompt") or "",
                "reward": row.get("reward"),
                "turns": turns,
                "pieces": all_pieces,
                "macro_end": macro_end[b, :at].tolist(),
            }
        )
    return items
