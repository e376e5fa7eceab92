"""Macro actions (MA-RLHF): termination rules, segments and their aggregation (macro-level GAE:
:mod:`marlhf.algo.macro_gae`)."""

from marlhf.macro.config import MacroConfig
from marlhf.macro.segments import (
    MacroSegments,
    build_segments,
    macro_weights,
    to_macro,
    to_tokens,
)
from marlhf.macro.termination import (
    RULES,
    TerminationInputs,
    TerminationOutput,
    TerminationRule,
    build_termination,
    register_rule,
)

__all__ = [
    "RULES",
    "MacroConfig",
    "MacroSegments",
    "TerminationInputs",
    "TerminationOutput",
    "TerminationRule",
    "build_segments",
    "build_termination",
    "macro_weights",
    "register_rule",
    "to_macro",
    "to_tokens",
]

# The parsing rule registers itself with @register_rule("parsing"); its module is optional here
# (it imports no heavy parser at module top, but may be absent from a trimmed install).
try:
    import marlhf.macro.parsing  # noqa: F401
except ImportError:
    pass
