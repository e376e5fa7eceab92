"""The random-initialised models and data of the acceptance run, built from configs alone (nothing
is downloaded): a Gemma-architecture pipeline model on the bundled tokenizer, and TRL's benchmark
shapes (a Llama policy and reward model on a word-level vocabulary of ``t0 … t{V-1}``,
``../shared/anchors/trl_ppo_bench.py``) with random prompts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from marlhf.models.load import resolve_model_path
from marlhf.models.reward_model import RewardModel, save_reward_model


def gemma_config(vocab: int, hidden: int, layers: int, tokenizer=None):
    """A Gemma config of ``hidden × layers``: head dim 256 (64 below 1024), one key/value head
    (Gemma-2B's multi-query attention), MLP 4 × hidden, tied embeddings."""
    from transformers import GemmaConfig

    head_dim = 256 if hidden >= 1024 else 64
    ids = {}
    if tokenizer is not None:
        ids = dict(
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    return GemmaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // head_dim),
        num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=1024,
        tie_word_embeddings=True, **ids,
    )  # fmt: skip


def _init_on(device: str, dtype: torch.dtype, build):
    """``build()`` with parameters created on ``device`` in ``dtype`` (fast random init on a GPU)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return build()
    finally:
        torch.set_default_dtype(old)


def pipeline_model(out: Path, hidden: int, layers: int, device: str) -> Path:
    """A random-initialised Gemma causal LM of ``hidden × layers`` with the embedded tiny model's
    tokenizer, saved (bf16) to ``out``; returns ``out``."""
    from transformers import AutoTokenizer, GemmaForCausalLM

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    cfg = gemma_config(len(tok), hidden, layers, tok)
    torch.manual_seed(0)
    model = _init_on(device, torch.bfloat16, lambda: GemmaForCausalLM(cfg))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return out


def word_tokenizer(vocab: int):
    """TRL's benchmark tokenizer: words ``t0 … t{vocab-1}``, pad t0, eos t1, bos t2, unk t3."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="t0", eos_token="t1", bos_token="t2", unk_token="t3"
    )


def bench_models(out: Path, hidden: int, layers: int, vocab: int, device: str) -> tuple[Path, Path]:
    """TRL's benchmark policy (a Llama of ``hidden × layers``, MLP ``hidden·8/3`` rounded to 64, head
    dim 64) and a reward model of the same shape, saved to ``out/actor`` and ``out/rm``."""
    from transformers import AutoModel, LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer(vocab)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
        max_position_embeddings=1024, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    actor = _init_on(device, torch.bfloat16, lambda: LlamaForCausalLM(cfg))
    actor.save_pretrained(out / "actor")
    tok.save_pretrained(out / "actor")
    del actor
    rm = _init_on(device, torch.bfloat16, lambda: RewardModel(AutoModel.from_config(cfg)))
    save_reward_model(rm.cpu(), tok, out / "rm", score_stats={"mean": 0.0, "std": 1.0})
    return out / "actor", out / "rm"


def random_prompts(path: Path, rows: int, words: int, vocab: int, seed: int = 0) -> Path:
    """A jsonl of ``rows`` prompts of ``words`` random words ``t4 … t{vocab-1}`` (the plain local
    schema: prompt, chosen, rejected)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (rows, words), generator=g).tolist()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in ids:
            prompt = " ".join(f"t{i}" for i in row)
            f.write(json.dumps({"prompt": prompt, "chosen": "t5", "rejected": "t6"}) + "\n")
    return path


def param_count(path: Path) -> int:
    """Parameters of the saved causal LM at ``path`` (from its config, on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())
