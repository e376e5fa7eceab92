"""A tiny BPE tokenizer trained in-process on synthetic posts (no hub access here)."""

from __future__ import annotations

import pytest


def make_tokenizer(add_bos: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from marlhf.data.synthetic import generate

    texts = []
    for row in generate(300, seed=7):
        texts.append(row["info"]["post"])
        texts += [s["text"] for s in row["summaries"]]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    if add_bos:
        bos = tok.token_to_id("<bos>")
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        unk_token="<unk>",
    )


@pytest.fixture(scope="session")
def tok():
    """Tokenizer that adds <bos> to encoded text (like Gemma's)."""
    return make_tokenizer(add_bos=True)


@pytest.fixture(scope="session")
def tok_nobos():
    """Tokenizer that adds no special tokens (like GPT-2's)."""
    return make_tokenizer(add_bos=False)
