"""Where a model comes from, checked before anything is loaded: a local path that does not exist, a
hub id missing from the local cache while ``HF_HUB_OFFLINE`` is set (or the hub cannot be reached),
a directory that is no model, or a reward-model directory (``reward_config.json``) where a causal LM
is expected, and the reverse. Each problem is one line naming the flag, the model and what to do.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Sequence
from urllib.parse import urlparse

REWARD_CONFIG_FILE = "reward_config.json"  # as marlhf.models.reward_model writes it
EMBEDDED_MODELS = (
    "tiny",
    "tiny-base",
    "tiny-rm-base",
    "tiny-base-16",
    "tiny-base-64",
    "tiny-base-256",
    "tiny-base-arith",
    "tiny-base-trail",
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
