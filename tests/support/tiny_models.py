"""The tiny Gemma configuration several model tests build (2 layers, hidden 32, one KV head of 16;
pad, EOS and BOS ids 0, 1, 2)."""

from transformers import GemmaConfig


def tiny_gemma_config(vocab: int, pad: int = 0, eos: int = 1, bos: int = 2) -> GemmaConfig:
    return GemmaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=bos,
    )
