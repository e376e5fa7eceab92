"""The embedded default model: a tiny Gemma-architecture causal LM with a BPE tokenizer trained on the
bundled corpus, saved as a normal Hugging Face directory.

No machine here can download weights, so ``--model_name_or_path tiny`` builds this model once (a few
seconds) into ``$MARLHF_HOME/tiny/<hash>`` (default ``~/.cache/marlhf``) and every stage, the inference
script and the tests load it like any other model directory. Real users pass ``google/gemma-2b`` or a
local path instead. It can also be built explicitly::

    python -m marlhf.tiny OUT_DIR

``tiny`` is randomly initialised: the fastest model for tests, but an SFT stage of a few minutes on
two cores cannot teach it to read a post (it writes one generic sentence and never stops). So the
project also ships ``--model_name_or_path tiny-base``: the same architecture and tokenizer
*pretrained* on 20,000 generated posts with correct summaries (``synthetic.pretraining_rows``,
a random stream apart from the bundled comparisons), the stand-in for a pretrained model such as
Gemma-2B. It writes TL;DRs in the right format and stops, but binds events to the wrong people
often (greedy gold score about 0.3, sampled about -0.5, where a perfect summary scores 1), which
leaves SFT and RLHF something real to improve. The weights live in ``marlhf/data/bundled/tiny_base``
(2.5 MB, fp32) with ``pretraining.json`` (recipe, figures); they were made, and can be remade, with::

    python -m marlhf.tiny --pretrain OUT_DIR          # ~11 min on 2 CPU cores
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


BASE_DIR = Path(__file__).resolve().parent / "data" / "bundled" / "tiny_base"
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
# The SFT-stage flags that pretrained the shipped base from `tiny` (the corpus path is added).
PRETRAIN_ROWS = 20000
PRETRAIN_FLAGS = (
    "--data_split", "10,0,0",
    "--max_seq_len", "192",
    "--per_device_train_batch_size", "32",
    "--per_device_eval_batch_size", "32",
    "--learning_rate", "3e-3",
    "--num_train_epochs", "2",
    "--warmup_ratio", "0.03",
    "--lr_scheduler_type", "cosine",
    "--zero_stage", "0",
    "--eval_iters", "4",
    "--seed", "1234",
)  # fmt: skip


def ensure_tiny_base() -> str:
    """Path of the shipped pretrained tiny model (``--model_name_or_path tiny-base``)."""
    missing = [f for f in BASE_FILES if not (BASE_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{BASE_DIR}: the shipped tiny-base model lacks {', '.join(missing)}; rebuild it with "
            f"`python -m marlhf.tiny --pretrain {BASE_DIR}`"
        )
    return str(BASE_DIR)


def pretrain_base(
    out_dir: str | Path,
    rows: int = PRETRAIN_ROWS,
    extra_flags: Iterable[str] = (),
    workdir: str | Path | None = None,
) -> Path:
    """Make ``tiny-base``: pretrain ``tiny`` on ``rows`` generated posts with the SFT stage.

    Runs ``python -m marlhf.stages.sft`` (a subprocess, like a user would) with ``PRETRAIN_FLAGS``
    plus ``extra_flags`` (later flags win, e.g. ``--max_steps 2`` for a smoke test) in ``workdir``
    (default: a temporary directory), then copies the model, its tokenizer and ``pretraining.json``
    (recipe and final eval perplexity) into ``out_dir``.
    """
    import subprocess

    from marlhf.data.synthetic import pretraining_rows

    out = Path(out_dir)
    tmp = None
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="tiny-pretrain-")
        workdir = tmp
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        corpus = work / "pretrain.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for row in pretraining_rows(rows):
                f.write(json.dumps(row) + "\n")
        flags = [*PRETRAIN_FLAGS, *extra_flags]
        cmd = [
            sys.executable, "-m", "marlhf.stages.sft",
            "--model_name_or_path", "tiny",
            "--data_path", str(corpus),
            "--data_output_path", str(work / "cache"),
            "--output_dir", str(work / "run"),
            *flags,
        ]  # fmt: skip
        subprocess.run(cmd, check=True)
        out.mkdir(parents=True, exist_ok=True)
        for name in (*BASE_FILES, "tokenizer_config.json"):
            shutil.copy2(work / "run" / name, out / name)
        with open(work / "run" / "metrics.jsonl") as f:
            evals = [r for r in map(json.loads, f) if "eval/ppl" in r]
        record = {
            "recipe": "python -m marlhf.tiny --pretrain OUT_DIR",
            "corpus": f"marlhf.data.synthetic.pretraining_rows({rows}, seed=0)",
            "base": f"tiny (random init, TINY_VERSION {TINY_VERSION})",
            "sft_flags": flags,
            "final_eval_ppl": evals[-1]["eval/ppl"] if evals else None,
            "steps": evals[-1]["step"] if evals else None,
        }
        (out / "pretraining.json").write_text(json.dumps(record, indent=2) + "\n")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m marlhf.tiny",
        description="Build the random tiny model (default) or pretrain tiny-base (--pretrain).",
    )
    ap.add_argument("out_dir")
    ap.add_argument("--pretrain", action="store_true", help="pretrain tiny-base into OUT_DIR")
    ap.add_argument("--rows", type=int, default=PRETRAIN_ROWS, help="pretraining posts")
    ap.add_argument("--workdir", default=None, help="keep the pretraining run here")
    args, extra = ap.parse_known_args(argv)
    if extra and not args.pretrain:
        ap.error(f"unrecognised arguments: {' '.join(extra)}")
    if args.pretrain:
        print(pretrain_base(args.out_dir, args.rows, extra, args.workdir))
    else:
        print(build_tiny(args.out_dir))


if __name__ == "__main__":
    main()
