"""Macro actions (MA-RLHF): termination rules, segments and their aggregation (macro-level GAE:
:mod:`marlhf.algo.macro_gae`).

The rules are a registry (:mod:`marlhf.macro.rules`); the ``parsing`` rule is registered by its
metadata, and its parser backends (:mod:`marlhf.macro.parsing`) are imported only when it is built.
"""

from marlhf.macro.config import MacroConfig
from marlhf.macro.rules import (
    RULES,
    Rule,
    TerminationInputs,
    TerminationOutput,
    TerminationRule,
    build_termination,
    register_rule,
    rule_class,
    termination_inputs,
)
from marlhf.macro.segments import (
    MacroSegments,
    build_segments,
    macro_weights,
    to_macro,
    to_tokens,
)

__all__ = [
    "RULES",
    "MacroConfig",
    "MacroSegments",
    "Rule",
    "TerminationInputs",
    "TerminationOutput",
    "TerminationRule",
    "build_segments",
    "build_termination",
    "macro_weights",
    "register_rule",
    "rule_class",
    "termination_inputs",
    "to_macro",
    "to_tokens",
]
