"""``marlhf view`` of the rows of ``marlhf infer --env`` (marlhf/inference/turn_view.py): each
policy turn with its reward and its macro actions, which end at the turn's end (a macro action never
spans an observation), each observation as context; control characters as escapes; a malformed
``turns`` field one error naming the line and field; and a rule that reads the policy gets its
log-probs where each action sits in the whole conversation."""

from __future__ import annotations

import html
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marlhf.inference import view
from marlhf.inference.models import Models
from marlhf.inference.turn_view import action_logprobs_and_entropy
from marlhf.inference.view import main as view_main
from marlhf.models.load import resolve_model_path

# every word is one token of the tiny tokenizer: turns of 4, 4 and 6 tokens (with their eos)
ROW = {
    "prompt_id": "g1",
    "prompt": "I lost my keys.",
    "prompt_messages": [{"role": "user", "content": "I lost my keys."}],
    "response": " my uncle has my keys",
    "reward": 1.5,
    "num_turns": 3,
    "stop": "done",
    "done": True,
    "turns": [
        {"role": "policy", "text": " call my boss", "reward": 0.25, "ends_with_eos": True},
        {"role": "observation", "text": "my boss: call my cousin.\x1b[2J", "message_role": "user"},
        {"role": "policy", "text": " call my cousin", "reward": 0.25, "ends_with_eos": True},
        {"role": "observation", "text": "my cousin: my \u202ekeys.", "message_role": "tool"},
        {"role": "policy", "text": " my uncle has my keys", "reward": 1.0, "ends_with_eos": True},
    ],
}
# --termination_condition fixed --ngram 3 on the turns' 14 tokens side by side: boundaries after
# tokens 3, 6, 9, 12 (1-based), after each turn's last token (4, 8), and the final eos alone
EXPECTED = [
    "policy 1, reward 0.2500:  call my boss|<eos>|",
    "    observation (user): my boss: call my cousin.\\x1b[2J",
    "policy 2, reward 0.2500:  call my| cousin<eos>|",
    "    observation (tool): my cousin: my \\u202ekeys.",
    "policy 3, reward 1.0000:  my| uncle has my| keys|<eos>|",
]
FIXED3 = ["--model", "tiny-base-trail", "--termination_condition", "fixed", "--ngram", "3"]


def _file(tmp_path, rows) -> str:
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_terminal_shows_turns_rewards_and_macro_actions_within_turns(tmp_path, capsys):
    single = {"prompt_id": "s", "prompt": "I lost", "response": " call my boss"}
    out = view_main([_file(tmp_path, [ROW, single]), *FIXED3, "--color", "never"])
    text = capsys.readouterr().out
    assert "[0] g1  reward 1.5000  3 turns, done" in text
    assert "prompt: I lost my keys." in text
    lines = text.split("prompt: I lost my keys.\n", 1)[1].splitlines()
    assert lines[: len(EXPECTED)] == EXPECTED
    assert "\x1b" not in text and "\u202e" not in text
    assert "[1] s\n call my boss|" in text  # a single-turn row beside it: one response
    item = out[0]["items"][0]
    assert (
        "".join(item["pieces"])
        == " call my boss<eos> call my cousin<eos> my uncle has my keys<eos>"
    )


def test_the_turn_rule_cuts_at_each_turns_end_without_loading_the_policy(
    tmp_path, capsys, monkeypatch
):
    """Turn boundaries come from the row's turns: the policy is never loaded for them."""

    def no_policy(*args, **kwargs):
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr(view, "load_models", no_policy)
    argv = ["--model", "tiny-base-trail", "--termination_condition", "turn", "--color", "never"]
    view.main([_file(tmp_path, [ROW]), *argv, "--eos_own_macro", "false"])
    text = capsys.readouterr().out
    lines = text.split("prompt: I lost my keys.\n", 1)[1].splitlines()
    # one macro action a policy turn, its eos included
    assert [ln for ln in lines if ln.startswith("policy")] == [
        "policy 1, reward 0.2500:  call my boss<eos>|",
        "policy 2, reward 0.2500:  call my cousin<eos>|",
        "policy 3, reward 1.0000:  my uncle has my keys<eos>|",
    ]


def test_the_turn_rule_on_a_single_response_row_is_one_error_naming_the_line(tmp_path):
    single = {"prompt_id": "s", "prompt": "I lost", "response": " call my boss"}
    path = _file(tmp_path, [ROW, single])
    argv = ["--model", "tiny-base-trail", "--termination_condition", "turn"]
    with pytest.raises(SystemExit) as err:
        view_main([path, *argv])
    assert str(err.value) == (
        f"error: {path} line 2: --termination_condition turn cuts the rows of episodes (a "
        '"turns" field, as `marlhf infer --env` writes them); this row is one response'
    )


def test_html_page_shows_turns_and_macro_actions_within_turns(tmp_path, capsys):
    out = view_main([_file(tmp_path, [ROW]), *FIXED3])
    capsys.readouterr()
    page = open(out[0]["html"], encoding="utf-8").read()
    policy = re.findall(
        r'<div class="turn policy"><div class="who">(.*?)</div><div class="response">(.*?)</div>',
        page,
    )
    assert [html.unescape(who) for who, _ in policy] == [
        "policy 1 · reward 0.2500",
        "policy 2 · reward 0.2500",
        "policy 3 · reward 1.0000",
    ]
    shown = [
        [html.unescape(s) for s in re.findall(r'<span class="ma"[^>]*>(.*?)</span>', body)]
        for _, body in policy
    ]
    assert shown == [
        [" call my boss", "<eos>"],
        [" call my", " cousin<eos>"],
        [" my", " uncle has my", " keys", "<eos>"],
    ]
    observations = re.findall(
        r'<div class="turn observation"><div class="who">(.*?)</div><div class="obs">(.*?)</div>',
        page,
    )
    assert [(w, html.unescape(t)) for w, t in observations] == [
        ("observation (user)", "my boss: call my cousin.\\x1b[2J"),
        ("observation (tool)", "my cousin: my \\u202ekeys."),
    ]
    assert "\x1b" not in page and "\u202e" not in page
    assert "reward 1.5000" in page


@pytest.mark.parametrize(
    ("turns", "field"),
    [
        ("x", '"turns" must be a list'),
        ([{"role": "assistant", "text": "a"}], '"turns"[0] must be an object whose "role"'),
        ([{"role": "policy", "text": 3}], '"turns"[0].text must be a string'),
        ([{"role": "policy", "text": "a", "reward": "high"}], '"turns"[0].reward must be'),
        ([{"role": "policy", "text": "a", "token_ids": [-1]}], '"turns"[0].token_ids must be'),
    ],
)
def test_a_malformed_turns_field_is_one_error(tmp_path, turns, field):
    path = _file(tmp_path, [{**ROW, "turns": turns}])
    with pytest.raises(SystemExit) as err:
        view_main([path, *FIXED3])
    assert str(err.value).startswith(f"error: {path} line 1: field {field}")


def test_a_policy_rule_reads_each_action_where_it_sits_in_the_conversation():
    """The reference: the whole conversation rendered at once by the chat template, each action's
    tokens found after the conversation before it rendered with its generation prompt, and the
    policy's log-probs and entropies (temperature 0.5) read at those tokens."""
    path = resolve_model_path("tiny-base-trail")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def render(messages, generation_prompt):
        text = tok.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )
        return tok(text, add_special_tokens=False)["input_ids"]

    messages = list(ROW["prompt_messages"])
    positions, actions = [], []
    for t in ROW["turns"]:
        if t["role"] == "policy":
            start = len(render(messages, True))
            ids = tok(t["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            positions += range(start, start + len(ids))
            actions.append(ids)
            messages.append({"role": "assistant", "content": t["text"]})
        else:
            messages.append({"role": t["message_role"], "content": t["text"]})
    whole = render(messages, False)
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0].float() / 0.5
    logp = torch.log_softmax(logits, -1)
    want_lp = torch.stack([logp[j - 1, whole[j]] for j in positions])
    want_ent = torch.stack([-(logp[j - 1].exp() * logp[j - 1]).sum() for j in positions])
    models = Models(model, tok, None, None, torch.device("cpu"))
    lp, ent = action_logprobs_and_entropy(models, ROW, actions, 0.5, 16, "f line 1")
    assert torch.allclose(lp[:14], want_lp, atol=1e-5) and (lp[14:] == 0).all()
    assert torch.allclose(ent[:14], want_ent, atol=1e-5)
