"""Tokenised datasets for the three stages, built from the phase split and cached on disk.

Prompt and response are tokenised separately (no special tokens) and their ids concatenated, so the
prompt/response boundary is exact whatever the tokenizer merges across it. Sequences are::

    [bos if the tokenizer adds one] + prompt ids + response ids + eot id

with the end-of-conversation token (``--end_of_conversation_token``, default the eos token; it must
be one token of the tokenizer) appended once. Truncation to ``max_seq_len`` keeps the start of the
response: the prompt loses tokens from the LEFT (its end, "TL;DR: " or "Assistant:", stays next to
the response) but keeps at least half the budget when it needs it; the response then loses tokens
from the RIGHT (and with them the eot token). A chosen/rejected pair shares one truncated prompt, so
``prompt_len`` is the same for both. How many prompts and responses were cut is kept with the set
and logged as a warning (on a cache hit too).

- ``build_sft_dataset`` (phase 1): ``input_ids``, ``labels`` (-100 on the prompt and bos unless
  ``--sft_include_prompt_loss``; padding never gets a label: the collator pads labels with -100).
- ``build_pair_dataset`` (phase 2): ``chosen_input_ids``, ``rejected_input_ids``, ``prompt_len``
  (index where the response starts, bos included) and ``margin`` (nan when the data has none).
- ``build_prompt_dataset`` (phase 3): ``input_ids`` (bos + prompt, unpadded), ``prompt_id``,
  ``prompt`` and ``meta`` (JSON: subreddit, APPS tests, ...); prompts longer than
  ``max_prompt_len`` are dropped (as the original did) or cut from the left.

Every builder takes the stage's ``seed``; the phase split uses ``cfg.split_seed(seed)``
(``--data_seed`` when set), and so does the cache key.

Examples without the needed fields (no chosen for SFT, no rejected for pairs) and pairs with no
preference (chosen and rejected identical, as text or once cut) are dropped; the counts are logged.
A set with no rows is never built: ``marlhf.data.report`` raises with the counts of every step.
Datasets listed in ``--data_path`` are concatenated in order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import weakref
from dataclasses import asdict
from pathlib import Path

import datasets

from marlhf.data.adapters import TEMPLATES_VERSION
from marlhf.data.cache import cached
from marlhf.data.chat import chat_examples, template_fingerprint
from marlhf.data.config import DataConfig
from marlhf.data.gym import fingerprint as gym_fingerprint
from marlhf.data.gym import is_gym_spec
from marlhf.data.long_tasks import LONG_TASKS_VERSION
from marlhf.data.long_tasks import TASKS as LONG_TASKS
from marlhf.data.reasoning_tasks import ARITH_VERSION
from marlhf.data.reasoning_tasks import TASKS as ARITH_TASKS
from marlhf.data.report import PhaseReport, SourceCounts, empty_set_error
from marlhf.data.schema import Example
from marlhf.data.sources import BUNDLED_SYNTHETIC, load_examples, parse_spec
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
    """``[id]`` of the end-of-conversation token (``cfg.end_of_conversation_token`` or eos).

    It must be one token of the tokenizer (not the unknown token): the reward model reads its score
    there and PPO stops generating on it, so text that encodes to several pieces (``<|endoftext|>``
    under a Llama tokenizer: ``<``, ``|``, ``end``, ...) is refused rather than appended to every
    response.
    """
    flag = cfg.end_of_conversation_token
    text = flag or tokenizer.eos_token
    if text is None:
        raise ValueError(
            "--end_of_conversation_token: the tokenizer has no eos token; pass one explicitly"
        )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    if len(ids) == 1 and not (ids[0] == unk and text != tokenizer.unk_token):
        return ids
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    what = f"--end_of_conversation_token {text!r}" if flag else f"the eos token {text!r}"
    unk_note = f", including the unknown token {tokenizer.unk_token!r}" if unk in ids else ""
    raise ValueError(
        f"{what} is not one token of the tokenizer of {name!r}: it encodes to {len(ids)} tokens "
        f"{tokenizer.convert_ids_to_tokens(ids)}{unk_note}. Pass a single token of this tokenizer "
        f"(its eos token is {tokenizer.eos_token!r}) or omit the flag to use the eos token."
    )


# tokenizer -> (its size, special tokens and name, its fingerprint): a stage asks once per data set
# (train, eval, prompts, ...), and hashing a large vocabulary costs most of a second
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer) -> dict:
    """What identifies a tokenizer for the cache: its name, a hash of vocabulary and special tokens.

    Computed once per tokenizer object, again when its size, special tokens, bos or name change (a
    token added, a pad token set)."""
    state = (
        len(tokenizer),
        tuple(tokenizer.all_special_tokens),
        tuple(bos_prefix(tokenizer)),
        getattr(tokenizer, "name_or_path", ""),
    )
    try:
        seen = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weakly referable: computed each time
        seen = None
    if seen is not None and seen[0] == state:
        return dict(seen[1])
    fingerprint = _fingerprint(tokenizer)
    with contextlib.suppress(TypeError):
        _FINGERPRINTS[tokenizer] = (state, fingerprint)
    return dict(fingerprint)


def _fingerprint(tokenizer) -> dict:
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
def _phase_examples(
    cfg: DataConfig,
    split: str,
    seed: int,
    phase: int,
    report: PhaseReport | None = None,
    tokenizer=None,
) -> list[Example]:
    """The examples of ``phase`` of every ``--data_path`` entry's ``split``, concatenated;
    ``report`` (when given) receives each entry's counts. With ``--apply_chat_template`` the
    prompts are rendered by ``tokenizer``'s chat template (`marlhf.data.chat`)."""
    out: list[Example] = []
    for spec in cfg.data_path:
        counts = SourceCounts(spec)
        exs, _ = load_examples(
            spec,
            split,
            skip_bad_rows=cfg.skip_bad_rows,
            max_samples=cfg.max_samples,
            webgpt_skip_ties=cfg.webgpt_skip_ties,
            counts=counts,
            columns=cfg.column_mapping(),
        )
        idx = phase_indices(len(exs), cfg.data_split, phase, cfg.split_seed(seed))
        counts.in_phase = len(idx)
        if report is not None:
            report.sources.append(counts)
        out += [exs[i] for i in idx]
        log.info("%s [%s] phase %d: %d of %d examples", spec, split, phase, len(idx), len(exs))
    return chat_examples(out, tokenizer) if cfg.apply_chat_template else out


def _source_fingerprint(spec: str) -> dict:
    """Local files' sizes and mtimes (the hub and the bundled file are identified by name, a
    reasoning-gym task by its package's version)."""
    if is_gym_spec(spec):
        return gym_fingerprint(spec)
    _, local = parse_spec(spec)
    if local is None:
        adapter, _ = parse_spec(spec)
        if adapter is not None and adapter.name == "synthetic-tldr":
            local = str(BUNDLED_SYNTHETIC)
        elif adapter is not None and adapter.name in LONG_TASKS:
            # generated, deterministic: identified by name and generator version, not file times
            return {"spec": spec, "generator": f"long_tasks v{LONG_TASKS_VERSION}"}
        elif adapter is not None and adapter.name in ARITH_TASKS:
            return {"spec": spec, "generator": f"reasoning_tasks v{ARITH_VERSION}"}
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
    if not fields.get("data_columns"):  # no mapping: the key of the runs before the flag existed
        fields.pop("data_columns", None)
    if fields["apply_chat_template"]:  # the template itself changes the prompts
        extra["chat_template"] = template_fingerprint(tokenizer)
    else:  # off: the keys of the entries made before the flag existed
        fields.pop("apply_chat_template")
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
class _Cuts:
    """What truncation to ``--max_seq_len`` cut: prompts (from the left) and responses (the right)."""

    def __init__(self) -> None:
        self.prompts = self.responses = self.most_prompt_tokens = 0

    def add(self, prompt: list[int], kept: list[int], responses, kept_responses) -> None:
        if len(kept) < len(prompt):
            self.prompts += 1
            self.most_prompt_tokens = max(self.most_prompt_tokens, len(prompt) - len(kept))
        self.responses += any(
            len(k) < len(r) for r, k in zip(responses, kept_responses, strict=True)
        )


def _info(report: PhaseReport, n: int, cuts: _Cuts | None = None, **extra) -> datasets.DatasetInfo:
    """The set's build notes (rows, drops by reason, cuts), kept in the cache with it, so that a
    cache hit warns like the build did."""
    notes = {"rows": n, "dropped": report.dropped, **extra}
    if cuts is not None:
        notes.update(
            prompts_cut=cuts.prompts,
            prompt_tokens_cut_max=cuts.most_prompt_tokens,
            responses_cut=cuts.responses,
        )
    return datasets.DatasetInfo(description=json.dumps(notes))


def _warn_notes(ds: datasets.Dataset, what: str, split: str, phase: int, limit: str) -> dict:
    """Log the drops and cuts recorded by the builder; return the notes."""
    notes = json.loads(ds.info.description or "{}")
    where = f"{split} {what} (phase {phase})"
    for reason, n in notes.get("dropped", {}).items():
        log.warning("%s: %d dropped: %s", where, n, reason)
    if notes.get("prompts_cut"):
        log.warning(
            "%s: %d of %d prompts cut from the left to fit %s (up to %d tokens lost: their "
            "start, e.g. the question or the Human turn, is gone); raise it to keep them whole",
            where,
            notes["prompts_cut"],
            notes["rows"],
            limit,
            notes["prompt_tokens_cut_max"],
        )
    if notes.get("responses_cut"):
        log.warning(
            "%s: %d of %d responses cut at the end to fit %s (the end-of-conversation token is "
            "lost with the end)",
            where,
            notes["responses_cut"],
            notes["rows"],
            limit,
        )
    return notes


def build_sft_dataset(cfg: DataConfig, tokenizer, split: str, seed: int) -> datasets.Dataset:
    """Phase-1 SFT dataset: ``input_ids`` and ``labels`` (unpadded lists of ints)."""

    def build() -> datasets.Dataset:
        report = PhaseReport()
        exs = _phase_examples(cfg, split, seed, 1, report, tokenizer)
        usable = [e for e in exs if e.chosen is not None]
        report.drop(
            "examples without a chosen response",
            len(exs) - len(usable),
            "SFT trains on the chosen response: use data with a chosen column",
        )
        if not usable:
            raise empty_set_error(report, "SFT examples", split, 1, cfg.data_split)
        bos, eot = bos_prefix(tokenizer), eot_ids(cfg, tokenizer)
        prompts = _encode(tokenizer, [e.prompt for e in usable])
        responses = _encode(tokenizer, [e.chosen for e in usable])
        budget = cfg.max_seq_len - len(bos)
        input_ids, labels, cuts = [], [], _Cuts()
        for p0, r0 in zip(prompts, responses, strict=True):
            p, (r,) = fit(p0, [r0 + eot], budget)
            cuts.add(p0, p, [r0 + eot], [r])
            ids = bos + p + r
            n_prompt = len(bos) + len(p)
            lab = list(ids) if cfg.sft_include_prompt_loss else [IGNORE_INDEX] * n_prompt + r
            input_ids.append(ids)
            labels.append(lab)
        info = _info(report, len(input_ids), cuts)
        return datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels}, info=info)

    key = cache_key(cfg, tokenizer, split, seed, 1, kind="sft")
    ds = cached(cfg.data_output_path, key, build)
    _warn_notes(ds, "SFT examples", split, 1, f"--max_seq_len {cfg.max_seq_len}")
    return ds


def build_pair_dataset(
    cfg: DataConfig, tokenizer, split: str, seed: int, phase: int = 2
) -> datasets.Dataset:
    """Preference pairs: ``chosen_input_ids``, ``rejected_input_ids``, ``prompt_len``, ``margin``.

    A pair whose chosen and rejected sequences are identical (the same text, or the same tokens once
    cut to ``max_seq_len``) states no preference: it is dropped and counted."""

    def build() -> datasets.Dataset:
        report = PhaseReport()
        exs = _phase_examples(cfg, split, seed, phase, report, tokenizer)
        usable = [e for e in exs if e.chosen is not None and e.rejected is not None]
        report.drop(
            "examples without a chosen and a rejected response",
            len(exs) - len(usable),
            "the reward model needs pairs: use data with chosen and rejected columns",
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
        cuts = _Cuts()
        for e, p0, c0, r0 in zip(usable, prompts, chosen, rejected, strict=True):
            p, (c, r) = fit(p0, [c0 + eot, r0 + eot], budget)
            if c == r:
                if e.chosen == e.rejected:
                    report.drop("pairs with chosen == rejected (no preference)")
                else:
                    report.drop(
                        f"pairs identical once cut to --max_seq_len {cfg.max_seq_len}",
                        fix="raise --max_seq_len so that the two responses differ",
                    )
                continue
            cuts.add(p0, p, [c0 + eot, r0 + eot], [c, r])
            cols["chosen_input_ids"].append(bos + p + c)
            cols["rejected_input_ids"].append(bos + p + r)
            cols["prompt_len"].append(len(bos) + len(p))
            cols["margin"].append(math.nan if e.margin is None else float(e.margin))
        if not cols["prompt_len"]:
            raise empty_set_error(report, "preference pairs", split, phase, cfg.data_split)
        features = datasets.Features(
            {
                "chosen_input_ids": datasets.Sequence(datasets.Value("int32")),
                "rejected_input_ids": datasets.Sequence(datasets.Value("int32")),
                "prompt_len": datasets.Value("int32"),
                "margin": datasets.Value("float32"),
            }
        )
        info = _info(report, len(cols["prompt_len"]), cuts)
        info.features = features
        return datasets.Dataset.from_dict(cols, features=features, info=info)

    key = cache_key(cfg, tokenizer, split, seed, phase, kind="pair")
    ds = cached(cfg.data_output_path, key, build)
    _warn_notes(ds, "preference pairs", split, phase, f"--max_seq_len {cfg.max_seq_len}")
    return ds


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

    Returns the dataset and the number of prompts longer than ``max_prompt_len``: dropped
    (``overlong="drop"``) or cut to their last tokens (``"truncate_left"``).
    """
    if overlong not in ("drop", "truncate_left"):
        raise ValueError(f"overlong must be 'drop' or 'truncate_left', got {overlong!r}")
    bos = bos_prefix(tokenizer)
    if max_prompt_len <= len(bos):
        raise ValueError(f"--max_prompt_seq_len must exceed {len(bos)}, got {max_prompt_len}")

    def build() -> datasets.Dataset:
        report = PhaseReport()
        exs = _phase_examples(cfg, split, seed, phase, report, tokenizer)
        prompts = _encode(tokenizer, [e.prompt for e in exs])
        budget = max_prompt_len - len(bos)
        cols: dict[str, list] = {"input_ids": [], "prompt_id": [], "prompt": [], "meta": []}
        cuts = _Cuts()
        n_overlong = 0
        for e, p in zip(exs, prompts, strict=True):
            if len(p) > budget:
                n_overlong += 1
                if overlong == "drop":
                    report.drop(
                        f"prompts longer than --max_prompt_seq_len {max_prompt_len}",
                        fix="raise --max_prompt_seq_len, or pass --overlong_prompts truncate to "
                        "keep their last tokens",
                    )
                    continue
                cuts.add(p, p[len(p) - budget :], [], [])
                p = p[len(p) - budget :]
            cols["input_ids"].append(bos + p)
            cols["prompt_id"].append(e.prompt_id)
            cols["prompt"].append(e.meta.get("plain_prompt", e.prompt))  # what gold scorers read
            cols["meta"].append(json.dumps(e.meta, sort_keys=True))
        if not cols["input_ids"]:
            raise empty_set_error(report, "PPO prompts", split, phase, cfg.data_split)
        features = datasets.Features(
            {
                "input_ids": datasets.Sequence(datasets.Value("int32")),
                "prompt_id": datasets.Value("string"),
                "prompt": datasets.Value("string"),
                "meta": datasets.Value("string"),
            }
        )
        info = _info(report, len(cols["input_ids"]), cuts, overlong=n_overlong)
        info.features = features
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
    notes = _warn_notes(ds, "PPO prompts", split, phase, f"--max_prompt_seq_len {max_prompt_len}")
    return ds, notes.get("overlong", 0)
