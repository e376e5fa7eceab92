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


def _word_tokenizer(words: list[str]):
    """A word-level tokenizer that knows only ``words`` (and its special tokens): anything else is
    its unknown token, as a tokenizer without byte fallback reads another model's markers."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<bos>", "<eos>"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                  bos_token="<bos>", eos_token="<eos>")  # fmt: skip
    out.name_or_path = "word-model"
    return out


def test_template_the_tokenizer_cannot_spell_is_one_error_naming_it(tmp_path):
    from tests.support.chat_model import TEMPLATE

    words = ["Hello", "Hi", "Thanks", "Q", "A", "B"]
    tok = _word_tokenizer(words)
    tok.chat_template = TEMPLATE  # <|user|> and <|assistant|>: not words of this vocabulary
    msgs = [{"role": "user", "content": "Q"}]
    # the independent reference: what the template renders, encoded by hand, is mostly <unk>
    ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False)["input_ids"]  # fmt: skip
    assert ids.count(tok.unk_token_id) >= 2
    with pytest.raises(ValueError) as err:
        render_prompt(tok, msgs)
    text = str(err.value)
    assert "\n" not in text and text.startswith(
        "--apply_chat_template: the tokenizer of word-model"
    )
    assert "cannot spell its chat template's markers" in text and "'<unk>'" in text
    # through the data of a stage: the same error before anything is tokenised or cached
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "Q", "chosen": "A"}) + "\n" for _ in range(12)))
    cfg = DataConfig(data_path=(str(data),), data_output_path=str(tmp_path / "cache"),
                     data_split="1,0,0", apply_chat_template=True)  # fmt: skip
    with pytest.raises(ValueError, match="cannot spell its chat template's markers"):
        build_sft_dataset(cfg, tok, "train", 0)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    # a template in the tokenizer's own words renders
    tok.chat_template = "{% for m in messages %}Q {{ m['content'] }} {% endfor %}A "
    assert render_prompt(tok, msgs) == "Q Q A "


def test_template_markers_lost_in_decoding_are_refused():
    """No unknown token, but the markers do not come back from the ids (a tokenizer that drops
    what it cannot spell)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "Hello", "Hi", "Thanks", "user"])}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    inner.normalizer = normalizers.Replace("<|", "")  # the markers' brackets vanish
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}<|user {{ m['content'] }} {% endfor %}"
    with pytest.raises(ValueError, match=r"the markers \['<\|user'"):
        render_prompt(tok, [{"role": "user", "content": "Hello"}])
