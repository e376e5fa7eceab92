"""Macro actions (MA-RLHF): termination rules, segments and their aggregation (macro-level GAE:
:mod:`marlhf.algo.macro_gae`).

The rules are a registry (:mod:`marlhf.macro.rules`, no torch): each built-in rule is declared there
and implemented in :mod:`marlhf.macro.termination` (``parsing``: :mod:`marlhf.macro.parsing`, with
its parser backends), imported when the rule is first built. The configuration and the registry
import without torch, so that every ``--help`` does; the names below that need torch (the rules at
work, the segments) load their module on first use.
"""

from __future__ import annotations

from marlhf.macro.config import MacroConfig
from marlhf.macro.rules import RULES, Rule, register_rule, rule_class
from marlhf.plugins import lazy_attributes

_LAZY = {
    "MacroSegments": "marlhf.macro.segments",
    "build_segments": "marlhf.macro.segments",
    "macro_weights": "marlhf.macro.segments",
    "to_macro": "marlhf.macro.segments",
    "to_tokens": "marlhf.macro.segments",
    "TerminationInputs": "marlhf.macro.termination",
    "TerminationOutput": "marlhf.macro.termination",
    "TerminationRule": "marlhf.macro.termination",
    "build_termination": "marlhf.macro.termination",
    "termination_inputs": "marlhf.macro.termination",
}

__all__ = ["RULES", "MacroConfig", "Rule", "register_rule", "rule_class", *sorted(_LAZY)]


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
