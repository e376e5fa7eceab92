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

The demo's reward model starts from a third shipped model, ``tiny-rm-base``
(``marlhf/data/bundled/tiny_rm_base``, 2 MB bf16, with its value head): tiny-base with two more
layers and four key/value heads instead of one, trained further as an LM and then as a preference
model on generated comparisons (held-out accuracy 0.81 against the labels, 0.92 against gold)::

    python -m marlhf.tiny --rm_base OUT_DIR           # ~47 min on 1 thread of 2 loaded cores

The multi-turn trail task (``marlhf.data.trail``, environments ``marlhf-trail-{2,4,8}``) has its own
shipped base, ``tiny-base-trail`` (``marlhf/data/bundled/tiny_base_trail``, bf16): tiny-base
pretrained on played games, whose tokenizer carries the task's chat template::

    python -m marlhf.tiny --pretrain OUT_DIR --trail

The multi-step arithmetic tasks (``marlhf.data.reasoning_tasks``) have ``tiny-base-arith``
(``marlhf/data/bundled/tiny_base_arith``, bf16): tiny-base pretrained on worked solutions. It writes
the solutions' format and reads the problem, the start's units digit only part of the time (4-step
accuracy 0.17 at T=1; ``pretraining.json`` has its figures)::

    python -m marlhf.tiny --pretrain OUT_DIR --arith
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from marlhf.runtime.home import home

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
    return Path(__file__).resolve().parents[1] / "data" / "bundled" / "synthetic_tldr.jsonl"


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
    save_model_files(model, out)
    tokenizer.save_pretrained(out)
    return out


def save_model_files(model, out: Path) -> None:
    """``model``'s config, generation config and weights in ``out``, the files ``save_pretrained``
    writes in a single process (tied LM head left out, ``format: pt``). Written directly because,
    once torch.distributed is initialised, transformers 5's ``save_pretrained`` writes weights and
    config on global rank 0 only, and every rank that builds its own copy (`ensure_tiny`) needs them."""
    from safetensors.torch import save_file

    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tensors = {k: v.detach().contiguous() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.architectures = [type(model).__name__]  # as save_pretrained records them
    model.config.dtype = next(model.parameters()).dtype
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)


def _publish(tmp: Path, target: Path, tries: int = 3) -> None:
    """Rename the complete build ``tmp`` to ``target``, unless another process already did; an
    incomplete ``target`` (without ``config.json``; older versions could leave one) is set aside."""
    for _ in range(tries):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if (target / "config.json").exists():  # another process won the race
                return
            broken = target.with_name(f".broken-{target.name}-{os.getpid()}")
            try:
                os.rename(target, broken)
            except FileNotFoundError:  # another process set it aside first
                continue
            shutil.rmtree(broken, ignore_errors=True)
    raise OSError(f"cannot publish the tiny model at {target}: it keeps changing under us")


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
        _publish(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


BASE_DIR = Path(__file__).resolve().parents[1] / "data" / "bundled" / "tiny_base"
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")


# The shipped bases of the long-horizon tasks (``marlhf.data.long_tasks``): ``tiny-base-{16,64,256}``
# (their recipe: ``marlhf.pipeline.recipes``).
HORIZON_BASE_DIRS = {
    h: Path(__file__).resolve().parents[1] / "data" / "bundled" / f"tiny_base_{h}"
    for h in (16, 64, 256)
}
HORIZON_BASES = {f"tiny-base-{h}": h for h in HORIZON_BASE_DIRS}
# Generation limit of each base: its tasks' longest answers plus room.
HORIZON_NEW_TOKENS = {16: 48, 64: 128, 256: 320}


def _shipped(path: Path, files: Iterable[str], name: str, remake: str) -> str:
    """``path`` of a shipped model once it holds ``files``; else an error naming what is missing
    and the command that remakes it (``remake``, which writes to ``path``)."""
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path}: the shipped {name} model lacks {', '.join(missing)}; rebuild it with "
            f"`python -m marlhf.tiny {remake}`"
        )
    return str(path)


def ensure_tiny_base() -> str:
    """Path of the shipped pretrained tiny model (``--model_name_or_path tiny-base``)."""
    return _shipped(BASE_DIR, BASE_FILES, "tiny-base", f"--pretrain {BASE_DIR}")


def ensure_horizon_base(name: str) -> str:
    """Path of a shipped long-horizon base (``--model_name_or_path tiny-base-{16,64,256}``)."""
    if name not in HORIZON_BASES:
        raise ValueError(f"{name!r} is not a long-horizon base; known: {', '.join(HORIZON_BASES)}")
    path = HORIZON_BASE_DIRS[HORIZON_BASES[name]]
    return _shipped(path, BASE_FILES, name, f"--pretrain {path} --horizon {HORIZON_BASES[name]}")


# The shipped base of the multi-step arithmetic tasks (``marlhf.data.reasoning_tasks``):
# ``tiny-base-arith`` (its recipe: ``marlhf.pipeline.recipes``), and its generation limit (the longest
# 16-step solutions, 248 tokens, plus room).
ARITH_BASE = "tiny-base-arith"
ARITH_BASE_DIR = Path(__file__).resolve().parents[1] / "data" / "bundled" / "tiny_base_arith"
ARITH_NEW_TOKENS = 320


def ensure_arith_base() -> str:
    """Path of the shipped base of the arithmetic tasks (``--model_name_or_path tiny-base-arith``)."""
    return _shipped(ARITH_BASE_DIR, BASE_FILES, ARITH_BASE, f"--pretrain {ARITH_BASE_DIR} --arith")


# The shipped base of the multi-turn trail task (``marlhf.data.trail``): ``tiny-base-trail``, tiny-base
# pretrained on played games, with the task's chat template (its recipe: ``marlhf.pipeline.recipes``).
TRAIL_BASE_NAME = "tiny-base-trail"
TRAIL_BASE_DIR = Path(__file__).resolve().parents[1] / "data" / "bundled" / "tiny_base_trail"
TRAIL_BASE_FILES = (*BASE_FILES, "tokenizer_config.json", "chat_template.jinja")
# Generation limit of one turn of the trail task (its actions are 3-6 tokens and the end of turn).
TRAIL_NEW_TOKENS = 16


def ensure_trail_base() -> str:
    """Path of the shipped base of the trail task (``--model_name_or_path tiny-base-trail``)."""
    return _shipped(
        TRAIL_BASE_DIR, TRAIL_BASE_FILES, TRAIL_BASE_NAME, f"--pretrain {TRAIL_BASE_DIR} --trail"
    )


RM_BASE_DIR = Path(__file__).resolve().parents[1] / "data" / "bundled" / "tiny_rm_base"
RM_BASE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def ensure_tiny_rm_base() -> str:
    """Path of the shipped reward-model base (``tiny-rm-base``; the demo's RM stage starts from it)."""
    return _shipped(RM_BASE_DIR, RM_BASE_FILES, "tiny-rm-base", f"--rm_base {RM_BASE_DIR}")
