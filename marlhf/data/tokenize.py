"""Tokenised datasets for the three stages, built from the phase split and cached on disk.

Prompt and response are tokenised separately (no special tokens) and their ids concatenated, so the
prompt/response boundary is exact whatever the tokenizer merges across it. Sequences are::

    [bos if the tokenizer adds one] + prompt ids + response ids + eot ids

with the end-of-conversation token (``--end_of_conversation_token``, default the eos token)
appended once. Truncation to ``max_seq_len`` keeps the start of the response: the prompt loses
tokens from the LEFT (its end, "TL;DR: " or "Assistant:", stays next to the response) but keeps at
least half the budget when it needs it; the response then loses tokens from the RIGHT (and with
them the eot token). A chosen/rejected pair shares one truncated prompt, so ``prompt_len`` is the
same for both.

- ``build_sft_dataset`` (phase 1): ``input_ids``, ``labels`` (-100 on the prompt and bos unless
  ``--sft_include_prompt_loss``; padding never gets a label: the collator pads labels with -100).
- ``build_pair_dataset`` (phase 2): ``chosen_input_ids``, ``rejected_input_ids``, ``prompt_len``
  (index where the response starts, bos included) and ``margin`` (nan when the data has none).
- ``build_prompt_dataset`` (phase 3): ``input_ids`` (bos + prompt, unpadded), ``prompt_id``,
  ``prompt`` and ``meta`` (JSON: subreddit, APPS tests, ...); prompts longer than
  ``max_prompt_len`` are dropped (as the original did) or cut from the left.

Every builder takes the stage's ``seed``; the phase split uses ``cfg.split_seed(seed)``
(``--data_seed`` when set), and so does the cache key.

Examples without the needed fields (no chosen for SFT, no rejected for pairs) are skipped; the
counts are logged. Datasets listed in ``--data_path`` are concatenated in order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict
from pathlib import Path

import datasets

from marlhf.data.adapters import BUNDLED_SYNTHETIC, TEMPLATES_VERSION, load_examples, parse_spec
from marlhf.data.cache import cached
from marlhf.data.config import DataConfig
from marlhf.data.long_tasks import LONG_TASKS_VERSION
from marlhf.data.long_tasks import TASKS as LONG_TASKS
from marlhf.data.schema import Example
from marlhf.data.split import phase_indices

log = logging.getLogger(__name__)

IGNORE_INDEX = -100


# --- tokenizer facts, computed once ------------------------------------------------------------
def bos_prefix(tokenizer) -> list[int]:
    """``[bos_id]`` if the tokenizer adds a bos token to encoded text, else ``[]``."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    return [bos] if with_special[:1] == [bos] and without[:1] != [bos] else []


def eot_ids(cfg: DataConfig, tokenizer) -> list[int]:
    """Ids of the end-of-conversation token (``cfg.end_of_conversation_token`` or eos)."""
    text = cfg.end_of_conversation_token or tokenizer.eos_token
    if text is None:
        raise ValueError(
            "--end_of_conversation_token: the tokenizer has no eos token; pass one explicitly"
        )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"--end_of_conversation_token {text!r} encodes to no tokens")
    return ids


def tokenizer_fingerprint(tokenizer) -> dict:
    """What identifies a tokenizer for the cache: its name, a hash of vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items())
    blob = json.dumps(
        [vocab, tokenizer.all_special_tokens, bos_prefix(tokenizer), type(tokenizer).__name__]
    )
    return {
        "name": getattr(tokenizer, "name_or_path", ""),
        "vocab_sha256": hashlib.sha256(blob.encode("utf-8")).hexdigest(),
    }


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def fit(
    prompt: list[int], responses: list[list[int]], budget: int
) -> tuple[list[int], list[list[int]]]:
    """Truncate a prompt (from the left) and its responses (from the right) to ``budget`` tokens.

    The prompt keeps ``min(len(prompt), budget // 2)`` tokens at least and otherwise yields to the
    longest response; every response then keeps what is left.
    """
    longest = max((len(r) for r in responses), default=0)
    if len(prompt) + longest <= budget:
        return prompt, responses
    keep = max(min(len(prompt), budget // 2), budget - longest)
    keep = min(keep, len(prompt))
    prompt = prompt[len(prompt) - keep :]
    room = budget - keep
    return prompt, [r[:room] for r in responses]


# --- examples of one phase ------------------------------------------------------------------------
def _phase_examples(cfg: DataConfig, split: str, seed: int, phase: int) -> list[Example]:
    out: list[Example] = []
    for spec in cfg.data_path:
        exs, _ = load_examples(
            spec,
            split,
            skip_bad_rows=cfg.skip_bad_rows,
            max_samples=cfg.max_samples,
            webgpt_skip_ties=cfg.webgpt_skip_ties,
        )
        idx = phase_indices(len(exs), cfg.data_split, phase, cfg.split_seed(seed))
        out += [exs[i] for i in idx]
        log.info("%s [%s] phase %d: %d of %d examples", spec, split, phase, len(idx), len(exs))
    return out


def _source_fingerprint(spec: str) -> dict:
    """Local files' sizes and mtimes (the hub and the bundled file are identified by name)."""
    _, local = parse_spec(spec)
    if local is None:
        adapter, _ = parse_spec(spec)
        if adapter is not None and adapter.name == "synthetic-tldr":
            local = str(BUNDLED_SYNTHETIC)
        elif adapter is not None and adapter.name in LONG_TASKS:
            # generated, deterministic: identified by name and generator version, not file times
            return {"spec": spec, "generator": f"long_tasks v{LONG_TASKS_VERSION}"}
        else:
            return {"spec": spec}
    path = Path(local)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {
        "spec": spec,
        "files": [[str(p), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in files],
    }


def cache_key(cfg: DataConfig, tokenizer, split: str, seed: int, phase: int, **extra) -> dict:
    """Everything that changes a tokenised dataset (see ``marlhf.data.cache``).

    ``seed`` is the stage's; the key holds the seed the phase split uses (``--data_seed`` when set),
    so stages and runs that differ only in ``--seed`` share an entry when they share a data seed, and
    a key without ``--data_seed`` is the key of the runs before that flag existed.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    fields = asdict(cfg)
    fields.pop("data_output_path")
    fields.pop("data_seed")  # it enters as "seed" below
    return {
        "sources": [_source_fingerprint(s) for s in cfg.data_path],
        "data": fields,
        "split": split,
        "seed": cfg.split_seed(seed),
        "phase": phase,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "eot": eot_ids(cfg, tokenizer),
        "templates_version": TEMPLATES_VERSION,
        **extra,
    }


# --- builders -----------------------------------------------------------------------------------
def build_sft_dataset(cfg: DataConfig, tokenizer, split: str, seed: int) -> datasets.Dataset:
    """Phase-1 SFT dataset: ``input_ids`` and ``labels`` (unpadded lists of ints)."""

    def build() -> datasets.Dataset:
        exs = [e for e in _phase_examples(cfg, split, seed, 1) if e.chosen is not None]
        bos, eot = bos_prefix(tokenizer), eot_ids(cfg, tokenizer)
        prompts = _encode(tokenizer, [e.prompt for e in exs])
        responses = _encode(tokenizer, [e.chosen for e in exs])
        budget = cfg.max_seq_len - len(bos)
        input_ids, labels = [], []
        for p, r in zip(prompts, responses, strict=True):
            p, (r,) = fit(p, [r + eot], budget)
            ids = bos + p + r
            n_prompt = len(bos) + len(p)
            lab = list(ids) if cfg.sft_include_prompt_loss else [IGNORE_INDEX] * n_prompt + r
            input_ids.append(ids)
            labels.append(lab)
        return datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels})

    key = cache_key(cfg, tokenizer, split, seed, 1, kind="sft")
    return cached(cfg.data_output_path, key, build)


def build_pair_dataset(
    cfg: DataConfig, tokenizer, split: str, seed: int, phase: int = 2
) -> datasets.Dataset:
    """Preference pairs: ``chosen_input_ids``, ``rejected_input_ids``, ``prompt_len``, ``margin``."""

    def build() -> datasets.Dataset:
        exs = _phase_examples(cfg, split, seed, phase)
        usable = [e for e in exs if e.chosen is not None and e.rejected is not None]
        if len(usable) < len(exs):
            log.info(
                "pairs: %d examples without a rejected response skipped", len(exs) - len(usable)
            )
        bos, eot = bos_prefix(tokenizer), eot_ids(cfg, tokenizer)
        prompts = _encode(tokenizer, [e.prompt for e in usable])
        chosen = _encode(tokenizer, [e.chosen for e in usable])
        rejected = _encode(tokenizer, [e.rejected for e in usable])
        budget = cfg.max_seq_len - len(bos)
        cols: dict[str, list] = {
            "chosen_input_ids": [],
            "rejected_input_ids": [],
            "prompt_len": [],
            "margin": [],
        }
        for e, p, c, r in zip(usable, prompts, chosen, rejected, strict=True):
            p, (c, r) = fit(p, [c + eot, r + eot], budget)
            cols["chosen_input_ids"].append(bos + p + c)
            cols["rejected_input_ids"].append(bos + p + r)
            cols["prompt_len"].append(len(bos) + len(p))
            cols["margin"].append(math.nan if e.margin is None else float(e.margin))
        features = datasets.Features(
            {
                "chosen_input_ids": datasets.Sequence(datasets.Value("int32")),
                "rejected_input_ids": datasets.Sequence(datasets.Value("int32")),
                "prompt_len": datasets.Value("int32"),
                "margin": datasets.Value("float32"),
            }
        )
        return datasets.Dataset.from_dict(cols, features=features)

    key = cache_key(cfg, tokenizer, split, seed, phase, kind="pair")
    return cached(cfg.data_output_path, key, build)


def build_prompt_dataset(
    cfg: DataConfig,
    tokenizer,
    split: str,
    seed: int,
    max_prompt_len: int,
    phase: int = 3,
    overlong: str = "drop",
) -> tuple[datasets.Dataset, int]:
    """PPO prompts: ``input_ids`` (bos + prompt, unpadded), ``prompt_id``, ``prompt``, ``meta`` (JSON).

    Returns the dataset and the number of prompts longer than ``max_prompt_len`` that were dropped
    (``overlong="drop"``; with ``"truncate_left"`` they keep their last tokens and none is dropped).
    """
    if overlong not in ("drop", "truncate_left"):
        raise ValueError(f"overlong must be 'drop' or 'truncate_left', got {overlong!r}")
    bos = bos_prefix(tokenizer)
    if max_prompt_len <= len(bos):
        raise ValueError(f"--max_prompt_seq_len must exceed {len(bos)}, got {max_prompt_len}")

    def build() -> datasets.Dataset:
        exs = _phase_examples(cfg, split, seed, phase)
        prompts = _encode(tokenizer, [e.prompt for e in exs])
        budget = max_prompt_len - len(bos)
        cols: dict[str, list] = {"input_ids": [], "prompt_id": [], "prompt": [], "meta": []}
        dropped = 0
        for e, p in zip(exs, prompts, strict=True):
            if len(p) > budget:
                if overlong == "drop":
                    dropped += 1
                    continue
                p = p[len(p) - budget :]
            cols["input_ids"].append(bos + p)
            cols["prompt_id"].append(e.prompt_id)
            cols["prompt"].append(e.prompt)
            cols["meta"].append(json.dumps(e.meta, sort_keys=True))
        features = datasets.Features(
            {
                "input_ids": datasets.Sequence(datasets.Value("int32")),
                "prompt_id": datasets.Value("string"),
                "prompt": datasets.Value("string"),
                "meta": datasets.Value("string"),
            }
        )
        info = datasets.DatasetInfo(
            description=json.dumps({"n_dropped": dropped}), features=features
        )
        return datasets.Dataset.from_dict(cols, features=features, info=info)

    key = cache_key(
        cfg,
        tokenizer,
        split,
        seed,
        phase,
        kind="prompt",
        max_prompt_len=max_prompt_len,
        overlong=overlong,
    )
    ds = cached(cfg.data_output_path, key, build)
    dropped = json.loads(ds.info.description or "{}").get("n_dropped", 0)
    if dropped:
        log.warning(
            "%d %s prompts longer than %d tokens dropped (phase %d)",
            dropped,
            split,
            max_prompt_len,
            phase,
        )
    return ds, dropped
