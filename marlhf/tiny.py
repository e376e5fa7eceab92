"""The embedded default model: a tiny Gemma-architecture causal LM with a BPE tokenizer trained on the
bundled corpus, saved as a normal Hugging Face directory.

No machine here can download weights, so ``--model_name_or_path tiny`` builds this model once (a few
seconds) into ``$MARLHF_HOME/tiny/<hash>`` (default ``~/.cache/marlhf``) and every stage, the inference
script and the tests load it like any other model directory. Real users pass ``google/gemma-2b`` or a
local path instead. It can also be built explicitly::

    python -m marlhf.tiny OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

# Bump when the recipe below changes: the cache key includes it.
TINY_VERSION = 1
TINY_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 512,
}
VOCAB_SIZE = 1536
SPECIAL = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}


def bundled_corpus_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "bundled" / "synthetic_tldr.jsonl"


def bundled_corpus() -> Iterator[str]:
    """Texts of the bundled synthetic TL;DR comparisons (posts, titles and summaries)."""
    path = bundled_corpus_path()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            info = row.get("info") or {}
            for key in ("post", "title", "subreddit"):
                if info.get(key):
                    yield str(info[key])
            for s in row.get("summaries") or []:
                if s.get("text"):
                    yield str(s["text"])


def home() -> Path:
    return Path(os.environ.get("MARLHF_HOME", Path.home() / ".cache" / "marlhf"))


def _corpus_digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"v": TINY_VERSION, "shape": TINY_SHAPE, "vocab": VOCAB_SIZE}).encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE tokenizer (adds ``<bos>`` like Gemma's) wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [SPECIAL["pad"], SPECIAL["eos"], SPECIAL["bos"], SPECIAL["unk"]]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(SPECIAL["bos"])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL['bos']} $A",
        pair=f"{SPECIAL['bos']} $A $B",
        special_tokens=[(SPECIAL["bos"], bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL["bos"],
        eos_token=SPECIAL["eos"],
        pad_token=SPECIAL["pad"],
        unk_token=SPECIAL["unk"],
        model_max_length=TINY_SHAPE["max_position_embeddings"],
    )


def build_tiny(out_dir: str | Path, texts: list[str] | None = None, seed: int = 0) -> Path:
    """Train the tokenizer, initialise the model from config and save both to ``out_dir``."""
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM, GenerationConfig

    texts = list(bundled_corpus()) if texts is None else texts
    tokenizer = train_tokenizer(texts)
    config = GemmaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        **TINY_SHAPE,
    )
    torch.manual_seed(seed)
    model = GemmaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=0.8,
        top_k=50,
        top_p=1.0,
        max_new_tokens=64,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def ensure_tiny() -> str:
    """Path of the cached tiny model, building it on first use (atomic; safe with several ranks)."""
    texts = list(bundled_corpus())
    target = home() / "tiny" / f"gemma-{_corpus_digest(texts)}"
    if (target / "config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
    try:
        build_tiny(tmp, texts)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # someone else won the race only if it exists
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m marlhf.tiny OUT_DIR")
    print(build_tiny(args[0]))


if __name__ == "__main__":
    main()
