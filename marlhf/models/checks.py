"""Do the models of one run share one tokenizer: the critic and the reward model read the actor's
token ids, so actor, reference, critic and reward model must have the same vocabulary, special token
ids and BOS rule, and no embedding may be smaller than the actor's vocabulary
(:func:`check_same_tokenizer`, called by the PPO stage before any weights are loaded and by
``python -m marlhf.preflight ppo``).

Do they see the texts they were trained on: a model a stage saved records the data settings it
was trained with in its ``run_config.json``; a run that renders prompts otherwise
(``--apply_chat_template``) or ends responses with another token (``--end_of_conversation_token``)
shows it other texts than it learned on, and a reward model scores them silently differently
(:func:`settings_mismatches`: PPO refuses such a run unless ``--allow_settings_mismatch``,
``marlhf infer`` warns).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlhf.config import ModelConfig
from marlhf.data.tokenize import bos_prefix
from marlhf.models.load import load_tokenizer, resolve_model_path
from marlhf.models.sources import REWARD_CONFIG_FILE, looks_local
from marlhf.rewards.registry import reads_reward_model


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
    models: dict[str, str],
    *,
    trust_remote_code: bool = False,
    what_to_do: str | None = None,
    loaded: dict[str, Any] | None = None,
) -> None:
    """Refuse models that do not share the first one's tokenizer.

    Args:
        models: flag -> model (path or hub id), the first being the one whose token ids the others
            read (the actor). Each distinct model's tokenizer is loaded once.
        what_to_do: the advice appended to the error; a default for PPO otherwise.
        loaded: model (as in ``models``) -> its tokenizer, already loaded by the caller (not
            loaded again).

    Raises:
        ValueError naming both flags, both models and what differs (vocabulary size, special ids,
        BOS, vocabulary hash), or a model whose embedding has fewer rows than the first tokenizer has
        tokens (its ``index out of range``).
    """
    sigs: dict[str, TokenizerSignature] = {}
    problems = []
    (first_flag, first), *_ = models.items()
    for flag, name in models.items():
        path = resolve_model_path(name)
        if path not in sigs:
            tok = (loaded or {}).get(name)
            if tok is None:
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


# --- the settings a model was trained with --------------------------------------------------------
# the data settings that change the text a model reads: how prompts are rendered, and the token
# that ends every response (where a reward model reads its score, where an actor learned to stop)
SEEN_SETTINGS = ("apply_chat_template", "end_of_conversation_token")


def trained_settings(model: str) -> tuple[Path, dict[str, Any]] | None:
    """(its ``run_config.json``, the :data:`SEEN_SETTINGS` recorded there) of a model directory a
    stage saved (SFT, reward model, PPO's actor and critic); None for any other model."""
    path = Path(model) / "run_config.json"
    try:
        data = json.loads(path.read_text()).get("data", {})
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(data, dict):
        return None
    found = {k: data[k] for k in SEEN_SETTINGS if k in data}
    return (path, found) if found else None


def _eos_text(model: str) -> str | None:
    """The eos token of a model directory's tokenizer (``tokenizer_config.json``), None if unknown:
    what ``--end_of_conversation_token`` defaults to."""
    try:
        eos = json.loads((Path(model) / "tokenizer_config.json").read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return eos.get("content") if isinstance(eos, dict) else eos


def settings_mismatches(models: Mapping[str, str | None], settings: Mapping[str, Any]) -> list[str]:
    """One line per model (``models``: flag -> model; None skipped) trained with another value of
    a :data:`SEEN_SETTINGS` than ``settings`` (this run's, by field name), naming the flag, the
    model, both values and the model's ``run_config.json``. An end-of-conversation token not
    given is the model's eos token, on either side.

    >>> settings_mismatches({"--model_name_or_path": "no/such/dir"}, {"apply_chat_template": True})
    []
    """
    out, seen = [], set()
    for flag, model in models.items():
        found = trained_settings(model) if model else None
        if found is None or found[0] in seen:
            continue
        path, trained = found
        seen.add(path)
        for key, was in trained.items():
            if key not in settings:
                continue
            now = settings[key]
            if key == "end_of_conversation_token":
                eos = _eos_text(model)
                was, now = was or eos, now or eos
                if was != now:
                    out.append(
                        f"{flag} {model} was trained with --{key} {json.dumps(was)} ({path}); "
                        f"this run has {json.dumps(now)}"
                    )
            elif bool(was) != bool(now):
                on = {True: "on", False: "off"}
                out.append(
                    f"{flag} {model} was trained with --{key} {on[bool(was)]} ({path}); this run "
                    f"has it {on[bool(now)]}"
                )
    return out


def ppo_model_roles(models_cfg: Any, reward_source: str) -> dict[str, str]:
    """flag -> model of stage 3 (``ActorCriticConfig``), actor first, with the stage's defaults
    (reference = actor, critic = actor when not given, reward model = critic)."""
    actor = models_cfg.actor.model.model_name_or_path
    roles = {
        "--actor_model_name_or_path": actor,
        "--reference_model_name_or_path": models_cfg.reference_model_name_or_path or actor,
        "--critic_model_name_or_path": models_cfg.critic.model.model_name_or_path or actor,
    }
    if reads_reward_model(reward_source):
        roles["--reward_model_name_or_path"] = (
            models_cfg.reward_model_name_or_path or roles["--critic_model_name_or_path"]
        )
    return roles


def model_flag(models_cfg: Any, role: str) -> str:
    """How a message names the model of ``role`` (critic, reward, reference) of stage 3: its flag
    and value, or, when the flag was not given, the flag of the model it defaults to."""
    actor = models_cfg.actor.model.model_name_or_path
    critic = models_cfg.critic.model.model_name_or_path
    given = {
        "critic": critic,
        "reward": models_cfg.reward_model_name_or_path,
        "reference": models_cfg.reference_model_name_or_path,
    }[role]
    if given:
        return f"--{role}_model_name_or_path {given}"
    if role == "reward" and critic:
        return (
            f"--critic_model_name_or_path {critic} (the reward model's default: "
            "--reward_model_name_or_path not given)"
        )
    who = "the critic's" if role == "critic" else f"the {role} model's"
    return (
        f"--actor_model_name_or_path {actor} ({who} default: --{role}_model_name_or_path not given)"
    )


def is_reward_dir(name: str) -> bool:
    """Whether ``name`` is a reward-model directory (stage 2's output)."""
    return os.path.isfile(os.path.join(name, REWARD_CONFIG_FILE))


def critic_head(models_cfg: Any, reward_source: str) -> str:
    """Whether the critic loads its reward model's value head (``trained``) or gets a new one on
    the backbone of its model (``fresh``): ``--critic_value_head``, where ``auto`` keeps the head
    of a reward-model directory and gives any other model a fresh one when the run has no reward
    model (a ``--reward_source`` without ``rm``: ``gold``, ``code``, ``none``, ...)."""
    name = models_cfg.critic.model.model_name_or_path or models_cfg.actor.model.model_name_or_path
    mode = models_cfg.critic_value_head
    if mode != "auto":
        return mode
    if is_reward_dir(name) or reads_reward_model(reward_source):
        return "trained"
    return "fresh"


def critic_problem(models_cfg: Any, reward_source: str) -> str | None:
    """Why the critic cannot start from its model (a trained head asked of a model that is no
    reward-model directory), naming the flag actually given (or the actor's, the critic's
    default) and the two ways out; None when it can."""
    name = models_cfg.critic.model.model_name_or_path or models_cfg.actor.model.model_name_or_path
    if critic_head(models_cfg, reward_source) == "fresh" or is_reward_dir(name):
        return None
    where = os.path.abspath(name) if os.path.isdir(name) else name
    if looks_local(name) and not os.path.exists(name):
        what = f"{os.path.abspath(os.path.expanduser(name))} does not exist"
    else:
        what = f"not a reward-model directory (no {REWARD_CONFIG_FILE} in {where})"
    return (
        f"{model_flag(models_cfg, 'critic')}: {what}, so the critic has no trained value head to "
        "start from. Pass the output of stage 2 as --critic_model_name_or_path, or start the "
        "critic from a model's backbone with a fresh value head: --critic_value_head fresh"
    )
