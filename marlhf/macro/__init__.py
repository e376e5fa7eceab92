"""Macro actions (MA-RLHF): termination rules, segments and their aggregation (macro-level GAE:
:mod:`marlhf.algo.macro_gae`).

The names below load their module on first use: the configuration (:mod:`marlhf.macro.config`,
read by every ``--help``) imports without torch, which the rules and segments need. The parsing
rule registers itself with ``@register_rule("parsing")`` when the rules are first asked for (its
module imports no heavy parser at module top, but may be absent from a trimmed install).
"""

from __future__ import annotations

import importlib

from marlhf.macro.config import MacroConfig

_LAZY = {
    "MacroSegments": "marlhf.macro.segments",
    "build_segments": "marlhf.macro.segments",
    "macro_weights": "marlhf.macro.segments",
    "to_macro": "marlhf.macro.segments",
    "to_tokens": "marlhf.macro.segments",
    "RULES": "marlhf.macro.termination",
    "TerminationInputs": "marlhf.macro.termination",
    "TerminationOutput": "marlhf.macro.termination",
    "TerminationRule": "marlhf.macro.termination",
    "build_termination": "marlhf.macro.termination",
    "register_rule": "marlhf.macro.termination",
}

__all__ = ["MacroConfig", *sorted(_LAZY)]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == "marlhf.macro.termination":
        try:
            importlib.import_module("marlhf.macro.parsing")  # registers the parsing rule
        except ImportError:
            pass
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
