"""Which macro-action rule to show for a policy: the one its actor was trained with, read from the
``run_config.json`` saved next to it (PPO writes one into ``actor/``, every checkpoint and the output
directory), with the macro-action flags a user gives on top.

A policy trained with ``--termination_condition fixed --ngram 5`` is shown in 5-token macro actions
without repeating the flags; ``--ngram 3`` on the command line shows it in 3-token ones. A model
without a saved run configuration (an SFT model: its run_config.json has no macro part, a hub id)
is shown with the flags alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from marlhf.macro.config import MacroConfig
from marlhf.macro.naming import describe

__all__ = ["describe", "resolve_macro", "trained_macro"]


def trained_macro(model: str) -> tuple[MacroConfig, Path] | None:
    """The macro-action part of ``<model>/run_config.json`` and that file, or None when ``model`` is
    no directory with such a file or the file has no ``macro`` part (SFT, the reward model)."""
    path = Path(model) / "run_config.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("macro")
    except (OSError, json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{path}: not a run configuration ({err})") from None
    if not isinstance(saved, dict):
        return None
    known = {f.name for f in dataclasses.fields(MacroConfig)}
    kw = {k: v for k, v in saved.items() if k in known}
    if isinstance(kw.get("ngram_choices"), list):
        kw["ngram_choices"] = tuple(kw["ngram_choices"])
    if isinstance(kw.get("entropy_threshold"), str):  # inf is saved as a string
        kw["entropy_threshold"] = float(kw["entropy_threshold"])
    try:
        return MacroConfig(**kw), path
    except ValueError as err:
        raise ValueError(f"{path}: macro part: {err}") from None


def changed_fields(flags: MacroConfig) -> frozenset[str]:
    """The fields of ``flags`` that differ from the defaults (what a programmatic caller set)."""
    default = MacroConfig()
    return frozenset(
        f.name
        for f in dataclasses.fields(MacroConfig)
        if getattr(flags, f.name) != getattr(default, f.name)
    )


def resolve_macro(
    model: str, flags: MacroConfig, given: Iterable[str] | None = None
) -> tuple[MacroConfig, str]:
    """The rule to show for ``model`` and where it came from (for titles and logs).

    Args:
        model: the policy's directory (or a hub id / embedded name, which has no saved rule).
        flags: the macro-action flags of the command.
        given: the names of the fields the user set explicitly (``cli.given_dests`` without the
            ``macro.`` prefix); None: those that differ from the defaults.

    The trained rule with the given fields replaced; without a trained rule, ``flags`` itself.
    """
    given = changed_fields(flags) if given is None else frozenset(given)
    trained = trained_macro(model)
    if trained is None:
        return flags, "the command line" if given else "the defaults (no run_config.json)"
    cfg, path = trained
    if not given:
        return cfg, f"{path}"
    merged = dataclasses.replace(cfg, **{k: getattr(flags, k) for k in sorted(given)})
    return merged, f"{path} with {', '.join('--' + k for k in sorted(given))} from the command line"
