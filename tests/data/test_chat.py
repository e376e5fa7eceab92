"""Chat templates (marlhf/data/chat.py): HH turns and messages lists to messages, the prompts the
tokenizer's template makes, the datasets SFT, RM and PPO tokenise, the messages adapter."""

from __future__ import annotations

import doctest
import json

import pytest

import marlhf.data.chat as chat
from marlhf.data.chat import chat_examples, hh_messages, prompt_messages, render_prompt
from marlhf.data.config import DataConfig
from marlhf.data.schema import DataError, Example
from marlhf.data.sources import load_examples
from marlhf.data.tokenize import (
    IGNORE_INDEX,
    build_pair_dataset,
    build_prompt_dataset,
    build_sft_dataset,
    cache_key,
)
from tests.support.chat_model import build_chat_model, write_hh


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_chat_model(tmp_path_factory.mktemp("chat") / "m"))


def test_doctests():
    assert doctest.testmod(chat).failed == 0


def test_webgpt_prompt_and_plain_prompt():
    assert hh_messages(" Human: Why is the sky blue? Assistant:") == [
        {"role": "user", "content": "Why is the sky blue?"}
    ]
    e = Example("POST\nTL;DR: ", "a", None, None, "x/1")
    assert prompt_messages(e) == [{"role": "user", "content": "POST\nTL;DR: "}]


def test_render_prompt_by_hand(tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    msgs.append({"role": "user", "content": "Cat?"})
    # the template by hand, without its BOS (the stages put the BOS token in front)
    assert (
        render_prompt(tok, msgs)
        == "<|user|>\nHi\n<|assistant|>\nYo\n<|user|>\nCat?\n<|assistant|>\n"
    )


def test_no_template_is_one_error_line(tmp_path):
    from transformers import AutoTokenizer

    from marlhf.models.zoo import build_tiny

    plain = AutoTokenizer.from_pretrained(build_tiny(tmp_path / "plain", ["a b c"] * 5))
    with pytest.raises(ValueError, match="has no chat_template"):
        render_prompt(plain, [{"role": "user", "content": "x"}])


def test_messages_adapter_and_conversational_plain_rows(tmp_path):
    path = tmp_path / "conv.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A"}],
         "rejected": [{"role": "assistant", "content": "B"}]}
        for i in range(12)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exs, _ = load_examples(str(path), "train")
    e = exs[0]
    assert (e.chosen, e.rejected) == ("A", "B")
    assert e.meta["messages"] == [
        {"role": "user", "content": e.prompt.split(": ")[1].split("\n")[0]}
    ]
    assert e.prompt.startswith("\n\nHuman: Q") and e.prompt.endswith("\n\nAssistant:")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "Q"}]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl line 1: field \"messages\""):
        load_examples(str(bad), "train")
    # a plain row whose prompt is a list of messages
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        json.dumps({"prompt": [{"role": "system", "content": "Be kind"},
                               {"role": "user", "content": "Q"}], "chosen": "A"}) + "\n"
    )  # fmt: skip
    (p,), _ = load_examples(str(plain), "train")
    assert p.meta["messages"][0] == {"role": "system", "content": "Be kind"}


def test_sft_rm_and_ppo_data_use_the_template(tok, tmp_path):
    data = write_hh(tmp_path / "hh")
    cfg = DataConfig(
        data_path=(str(data),), data_split="1,1,1", data_output_path=str(tmp_path / "cache"),
        max_seq_len=128, apply_chat_template=True,
    )  # fmt: skip
    exs = chat_examples(load_examples(str(data), "train")[0], tok)
    assert exs[0].prompt.startswith("<|user|>\nHello") and exs[0].prompt.endswith("<|assistant|>\n")
    assert not exs[0].chosen.startswith(" ")
    sft = build_sft_dataset(cfg, tok, "train", seed=1)
    ids, labels = sft[0]["input_ids"], sft[0]["labels"]
    text = tok.decode(ids)
    assert "<|user|>" in text and "<|assistant|>" in text and "Human:" not in text
    # the loss covers the answer (+ eos) only
    answer = [t for t, lab in zip(ids, labels, strict=True) if lab != IGNORE_INDEX]
    assert tok.decode(answer, skip_special_tokens=True).strip() in ("Feed him less.", "Walk him.")
    pairs = build_pair_dataset(cfg, tok, "train", seed=1)
    assert "<|assistant|>" in tok.decode(pairs[0]["chosen_input_ids"])
    prompts, _ = build_prompt_dataset(cfg, tok, "train", seed=1, max_prompt_len=96)
    assert tok.decode(prompts[0]["input_ids"]).rstrip().endswith("<|assistant|>")
    assert prompts[0]["prompt"].startswith("\n\nHuman:")  # gold scorers read the task's text
    # the flag and the template are part of the cache key; off, the key is the one without the flag
    off = DataConfig(**{**cfg.__dict__, "apply_chat_template": False})
    assert "chat_template" in cache_key(cfg, tok, "train", 1, 1)
    assert "apply_chat_template" not in cache_key(off, tok, "train", 1, 1)["data"]
