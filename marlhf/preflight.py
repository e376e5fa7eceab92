"""Checks that run before any model is loaded: do the models and data exist, is a directory the kind
of model its flag expects, and do the models of one run share one tokenizer.

Run once before launching ranks (every ``training/step*/training_scripts/run_*.sh`` does this before
``deepspeed``), with the stage's own flags::

    python -m marlhf.preflight sft --model_name_or_path google/gemma-2b --data_path ...
    python -m marlhf.preflight ppo --actor_model_name_or_path out/sft --critic_model_name_or_path out/rm

It prints one line per problem, each naming the flag, the model or data path and what to do, and
exits with status 2 (0 when everything is in place), in seconds, instead of every rank failing
with its own traceback. What it checks:

* a local-looking path (``/``, ``./``, ``../``, ``~``, more than one ``/``, a first component that
  exists here, ...) that does not exist: "does not exist";
* a hub id that is not in the local Hugging Face cache while ``HF_HUB_OFFLINE=1`` is set (or the
  hub cannot be reached): named with the cache directory and the variable;
* a directory that is not a model (no ``config.json``), a reward-model directory
  (``reward_config.json``) given as a causal LM (actor, reference, SFT base), and a critic or reward
  model that is not a reward-model directory;
* stage 3: actor, reference, critic and reward model with different tokenizers (vocabulary size,
  special token ids, whether BOS is added, a hash of the vocabulary), or an embedding smaller than
  the actor's vocabulary; the critic and the reward model read the actor's token ids, so they must
  share its tokenizer (:func:`check_same_tokenizer`, also called by the PPO stage itself);
* data: a local ``--data_path`` entry that does not exist, or a name that is no known dataset.

Hub datasets are not looked up (``datasets`` has its own cache and offline rules); they fail, with
their name, when the stage loads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

REWARD_CONFIG_FILE = "reward_config.json"  # as marlhf.reward_model writes it
EMBEDDED_MODELS = (
    "tiny",
    "tiny-base",
    "tiny-rm-base",
    "tiny-base-16",
    "tiny-base-64",
    "tiny-base-256",
)
_TRUE = ("1", "ON", "YES", "TRUE")
# A hub repository id: "name" or "namespace/name"
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


# --- where a model comes from ---------------------------------------------------------------------
def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value."""
    return any(
        os.environ.get(v, "").strip().upper() in _TRUE
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache_dir() -> str:
    """The Hugging Face hub cache, from the environment at call time (``HF_HUB_CACHE``,
    ``HF_HOME``/hub, ``XDG_CACHE_HOME``/huggingface/hub, ``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return os.path.join(os.path.expanduser(home), "hub")


def cached_hub_snapshot(repo_id: str, filenames: Sequence[str] = ("config.json",)) -> str | None:
    """A snapshot directory of hub model ``repo_id`` in the local cache holding one of
    ``filenames``, else None."""
    snapshots = os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"), "snapshots")
    try:
        revisions = sorted(os.listdir(snapshots))
    except OSError:
        return None
    for rev in revisions:
        if any(os.path.exists(os.path.join(snapshots, rev, f)) for f in filenames):
            return os.path.join(snapshots, rev)
    return None


def looks_local(name: str) -> bool:
    """True for a name that can only be a local path (never a hub id)."""
    if name.startswith(("/", "./", "../", "~")) or name in (".", "..") or name.endswith("/"):
        return True
    if not _HUB_ID.fullmatch(name):
        return True
    first = name.split("/", 1)[0]
    return "/" in name and os.path.isdir(first)  # out/sft with ./out present


def hub_reachable(timeout_s: float = 5.0) -> bool:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT``) opens within ``timeout_s``."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def model_source_problem(
    name: str, flag: str | None = None, *, probe_network: bool = True, tokenizer_only: bool = False
) -> str | None:
    """Why model ``name`` cannot be loaded (one line naming it, the flag and what to do), or None.

    Local directories must exist (and hold ``config.json`` unless ``tokenizer_only``); a hub id
    must be in the local cache when ``HF_HUB_OFFLINE`` is set, or when ``probe_network`` and the hub
    cannot be reached. The embedded models (``EMBEDDED_MODELS``) are always available.
    """
    if name in EMBEDDED_MODELS:
        return None
    what = f"{flag} {name}" if flag else f"model {name!r}"
    if os.path.isdir(name):
        marks = ("config.json", "adapter_config.json")
        if tokenizer_only or any(os.path.isfile(os.path.join(name, m)) for m in marks):
            return None
        return (
            f"{what}: the directory {os.path.abspath(name)} has no config.json, so it is not a "
            "Hugging Face model directory (an unfinished run? pass the directory the stage saved "
            "its final model to)"
        )
    if os.path.exists(name):
        return f"{what}: {os.path.abspath(name)} is a file; pass a model directory or a hub id"
    if looks_local(name):
        return f"{what}: {os.path.abspath(os.path.expanduser(name))} does not exist"
    files = ("tokenizer_config.json", "tokenizer.json", "config.json")
    if cached_hub_snapshot(name, files if tokenizer_only else ("config.json",)):
        return None
    if hub_offline():
        var = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        cause = f"{var}={os.environ.get(var)} is set, so nothing is downloaded"
    elif probe_network and not hub_reachable():
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        cause = f"the hub ({endpoint}) cannot be reached from here"
    else:
        return None
    return (
        f"{what}: {os.path.abspath(name)} does not exist, and the hub model {name} is not in the "
        f"local cache ({hub_cache_dir()}): {cause}. Download it where there is network "
        f"(`hf download {name}`, then copy the cache or set HF_HOME), or pass a local directory"
    )


def reward_dir_problem(path: str, flag: str | None = None, *, want_reward: bool) -> str | None:
    """A reward-model directory where a causal LM is expected (``want_reward=False``: its LM head
    would be random), or a non-reward-model where a reward model is expected; ``flag`` names the
    option it came from (None: unknown, the message lists the options)."""
    is_rm = os.path.isfile(os.path.join(path, REWARD_CONFIG_FILE))
    what = f"{flag} {path}" if flag else path
    if is_rm and not want_reward:
        policy = flag or (
            "the policy (--actor_model_name_or_path / --reference_model_name_or_path for PPO, "
            "--model_name_or_path for SFT, --model for inference)"
        )
        return (
            f"{what}: this is a reward-model directory (it has {REWARD_CONFIG_FILE}); loaded as a "
            f"causal LM its language-model head would be random. Pass the SFT model to {policy}, "
            "and this directory to --critic_model_name_or_path / --reward_model_name_or_path (PPO) "
            "or --reward-model (inference)"
        )
    if want_reward and not is_rm:
        where = os.path.abspath(path) if os.path.isdir(path) else path
        return (
            f"{what}: not a reward-model directory (no {REWARD_CONFIG_FILE} in {where}); "
            "pass the output directory of stage 2 (marlhf.stages.reward)"
        )
    return None


# --- tokenizers -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizerSignature:
    """What decides which ids a tokenizer produces: vocabulary (with added tokens), special ids,
    whether it prepends BOS."""

    source: str
    size: int  # len(tokenizer): vocabulary including added tokens
    special: tuple[tuple[str, int | None], ...]  # (("bos", id), ("eos", id), ("unk", id))
    adds_bos: bool
    vocab_sha256: str
    vocab: dict[str, int] = field(compare=False, repr=False)


def tokenizer_signature(tokenizer: Any, source: str | None = None) -> TokenizerSignature:
    from marlhf.data.tokenize import bos_prefix

    vocab = dict(tokenizer.get_vocab())
    blob = json.dumps(sorted(vocab.items()), ensure_ascii=False).encode("utf-8")
    special = tuple((k, getattr(tokenizer, f"{k}_token_id", None)) for k in ("bos", "eos", "unk"))
    return TokenizerSignature(
        source=source or getattr(tokenizer, "name_or_path", "") or "?",
        size=len(tokenizer),
        special=special,
        adds_bos=bool(bos_prefix(tokenizer)),
        vocab_sha256=hashlib.sha256(blob).hexdigest(),
        vocab=vocab,
    )


def _signature(t: Any) -> TokenizerSignature:
    return t if isinstance(t, TokenizerSignature) else tokenizer_signature(t)


def tokenizer_differences(a: Any, b: Any) -> list[str]:
    """What differs between two tokenizers (or signatures); empty when they map text to the same
    ids. E.g. ``["vocabulary size 256000 vs 50257", "eos id 1 vs 50256", ...]``."""
    a, b = _signature(a), _signature(b)
    out = []
    if a.size != b.size:
        out.append(f"vocabulary size {a.size} vs {b.size}")
    for (name, ia), (_, ib) in zip(a.special, b.special, strict=True):
        if ia != ib:
            out.append(f"{name} id {ia} vs {ib}")
    if a.adds_bos != b.adds_bos:
        out.append(f"adds BOS: {'yes' if a.adds_bos else 'no'} vs {'yes' if b.adds_bos else 'no'}")
    if a.vocab_sha256 != b.vocab_sha256:
        moved = sum(1 for t, i in a.vocab.items() if b.vocab.get(t) != i)
        moved += sum(1 for t in b.vocab if t not in a.vocab)
        out.append(
            f"vocabulary hash {a.vocab_sha256[:12]} vs {b.vocab_sha256[:12]} "
            f"({moved} tokens missing or with another id)"
        )
    return out


def same_tokenizer(a: Any, b: Any) -> bool:
    """Two tokenizers produce the same ids for the same text (see :func:`tokenizer_differences`)."""
    return not tokenizer_differences(a, b)


def _embedding_rows(path: str) -> int | None:
    """``vocab_size`` of a local model directory's config.json (text config of multimodal ones)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    rows = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return rows if isinstance(rows, int) else None


def check_same_tokenizer(
    models: dict[str, str], *, trust_remote_code: bool = False, what_to_do: str | None = None
) -> None:
    """Refuse models that do not share the first one's tokenizer.

    Args:
        models: flag -> model (path or hub id), the first being the one whose token ids the others
            read (the actor). Each distinct model's tokenizer is loaded once.
        what_to_do: the advice appended to the error; a default for PPO otherwise.

    Raises:
        ValueError naming both flags, both models and what differs (vocabulary size, special ids,
        BOS, vocabulary hash), or a model whose embedding has fewer rows than the first tokenizer has
        tokens (its ``index out of range``).
    """
    from marlhf.config import ModelConfig
    from marlhf.models import load_tokenizer, resolve_model_path

    sigs: dict[str, TokenizerSignature] = {}
    problems = []
    (first_flag, first), *_ = models.items()
    for flag, name in models.items():
        path = resolve_model_path(name)
        if path not in sigs:
            tok = load_tokenizer(
                ModelConfig(model_name_or_path=path, trust_remote_code=trust_remote_code)
            )
            sigs[path] = tokenizer_signature(tok, name)
        ref = sigs[resolve_model_path(first)]
        diff = tokenizer_differences(ref, sigs[path])
        if diff:
            problems.append(
                f"{first_flag} {first} and {flag} {name} have different tokenizers: "
                + "; ".join(diff)
            )
        rows = _embedding_rows(path) if os.path.isdir(path) else None
        if rows is not None and rows < ref.size:
            problems.append(
                f"{flag} {name}: its embedding has {rows} rows but the tokenizer of {first_flag} "
                f"{first} has {ref.size} tokens (ids >= {rows} would be out of range)"
            )
    if problems:
        advice = what_to_do or (
            "The critic and the reward model read the actor's token ids: train the reward model "
            "(stage 2) from the SFT model the actor starts from, or pass models that share its "
            "tokenizer"
        )
        raise ValueError("\n".join(problems) + "\n" + advice)


def ppo_model_roles(models_cfg: Any, reward_source: str) -> dict[str, str]:
    """flag -> model of stage 3 (``ActorCriticConfig``), actor first, with the stage's defaults
    (reference = actor, critic = actor when not given, reward model = critic)."""
    actor = models_cfg.actor_model_name_or_path
    roles = {
        "--actor_model_name_or_path": actor,
        "--reference_model_name_or_path": models_cfg.reference_model_name_or_path or actor,
        "--critic_model_name_or_path": models_cfg.critic_model_name_or_path or actor,
    }
    if reward_source in ("rm", "rm+code"):
        roles["--reward_model_name_or_path"] = (
            models_cfg.reward_model_name_or_path or roles["--critic_model_name_or_path"]
        )
    return roles


# --- data -----------------------------------------------------------------------------------------
_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".tsv", ".txt", ".arrow", ".gz")


def data_problem(spec: str) -> str | None:
    """A ``--data_path`` entry that is a missing local path or no known dataset, else None."""
    from marlhf.data.adapters import ADAPTERS, ALIASES, get_adapter

    if os.path.exists(spec):
        return None
    if ":" in spec:
        head, rest = spec.split(":", 1)
        if ALIASES.get(head, head) in ADAPTERS:
            if os.path.exists(rest):
                return None
            return f"--data_path {spec}: {os.path.abspath(os.path.expanduser(rest))} does not exist"
    if looks_local(spec) or spec.lower().endswith(_DATA_SUFFIXES):
        return f"--data_path {spec}: {os.path.abspath(os.path.expanduser(spec))} does not exist"
    try:
        get_adapter(spec)
    except ValueError as e:
        return str(e)
    return None


# --- the command ----------------------------------------------------------------------------------
def _stage_config(stage: str) -> type:
    if stage == "sft":
        from marlhf.stages.sft import SFTConfig

        return SFTConfig
    if stage == "reward":
        from marlhf.stages.reward import RewardStageConfig

        return RewardStageConfig
    from marlhf.stages.ppo import PPOStageConfig

    return PPOStageConfig


def _model_checks(stage: str, cfg: Any) -> list[tuple[str, str, str]]:
    """(flag, model, kind) to check; kind: ``causal`` (no reward-model dir), ``reward`` (must be
    one), ``model`` (any model directory) or ``tokenizer``."""
    out: list[tuple[str, str, str]] = []
    if stage in ("sft", "reward"):
        m = cfg.model
        out.append(
            ("--model_name_or_path", m.model_name_or_path, "causal" if stage == "sft" else "model")
        )
        if m.tokenizer_name_or_path:
            out.append(("--tokenizer_name_or_path", m.tokenizer_name_or_path, "tokenizer"))
        ref = (
            getattr(cfg.reward, "reference_model_name_or_path", None) if stage == "reward" else None
        )
        if ref:
            out.append(("--reference_model_name_or_path", ref, "causal"))
        return out
    mc, source = cfg.models, cfg.ppo.reward_source
    roles = ppo_model_roles(mc, source)
    out.append(("--actor_model_name_or_path", roles["--actor_model_name_or_path"], "causal"))
    if mc.reference_model_name_or_path:
        out.append(("--reference_model_name_or_path", mc.reference_model_name_or_path, "causal"))
    critic = roles["--critic_model_name_or_path"]
    out.append(("--critic_model_name_or_path", critic, "model" if source == "code" else "reward"))
    if "--reward_model_name_or_path" in roles and mc.reward_model_name_or_path:
        out.append(("--reward_model_name_or_path", mc.reward_model_name_or_path, "reward"))
    return out


def preflight(stage: str, cfg: Any, *, probe_network: bool = True) -> list[str]:
    """Every problem with the models and data of a parsed stage config (empty: all in place)."""
    problems = []
    for flag, name, kind in _model_checks(stage, cfg):
        if kind == "reward" and not os.path.isdir(name):
            # reward models are read from local directories only
            p = (
                f"{flag} {name}: the directory {os.path.abspath(name)} does not exist; pass the "
                "output directory of stage 2 (marlhf.stages.reward)"
            )
        else:
            p = model_source_problem(
                name, flag, probe_network=probe_network, tokenizer_only=kind == "tokenizer"
            )
        if p is None and kind in ("causal", "reward") and os.path.isdir(name):
            p = reward_dir_problem(name, flag, want_reward=kind == "reward")
        if p:
            problems.append(p)
    for spec in cfg.data.data_path:
        p = data_problem(spec)
        if p:
            problems.append(p)
    if stage == "ppo" and not problems:
        trust = cfg.models.trust_remote_code
        try:
            check_same_tokenizer(
                ppo_model_roles(cfg.models, cfg.ppo.reward_source), trust_remote_code=trust
            )
        except (ValueError, OSError) as e:
            problems.append(str(e))
    return problems


def print_plan(cfg: Any, opts: dict) -> list[str]:
    """``--plan``: prints the per-GPU memory plan of a PPO run (`marlhf.memory_plan`); a problem
    when it does not fit ``--gpu_memory``."""
    from marlhf.memory_plan import GiB, format_plan, ppo_plan

    plan = ppo_plan(cfg, opts["num_gpus"], opts["gpu_memory_gb"])
    print(format_plan(plan))
    if plan.fits is False:
        return [
            f"the plan needs {plan.total / GiB:.1f} GiB per GPU, more than --gpu_memory "
            f"{opts['gpu_memory_gb']:g}: add GPUs (--num_gpus), raise --actor_zero_stage / "
            "--critic_zero_stage, --offload, LoRA, activation checkpointing or smaller batches"
        ]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m marlhf.preflight STAGE [stage flags]``: 0 when the run can start, 2 otherwise.
    Stage 3 also takes ``--plan --num_gpus N [--gpu_memory GB]``: the memory plan
    (`marlhf.memory_plan`)."""
    from marlhf.cli import parse_config

    argv = list(sys.argv[1:] if argv is None else argv)
    stages = ("sft", "reward", "ppo")
    if not argv or argv[0] not in stages:
        print(
            f"usage: python -m marlhf.preflight {{{','.join(stages)}}} [stage flags...]",
            file=sys.stderr,
        )
        return 2
    stage = argv[0]
    from marlhf.memory_plan import split_plan_flags

    rest, plan = split_plan_flags(argv[1:]) if stage == "ppo" else (argv[1:], None)
    cfg = parse_config(_stage_config(stage), rest, description=f"preflight of stage {stage}")
    problems = preflight(stage, cfg)
    if plan is not None and not problems:
        problems = print_plan(cfg, plan)
    for p in problems:
        print(f"preflight: {p}", file=sys.stderr)
    if problems:
        print(
            f"preflight: {len(problems)} problem(s) with the models or data of stage {stage}; "
            "nothing was launched",
            file=sys.stderr,
        )
        return 2
    print(f"preflight: stage {stage}: models and data in place", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
