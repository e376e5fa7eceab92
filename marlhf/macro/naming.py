"""A short name of a macro-action rule, for titles, logs and run names.

>>> from marlhf.macro.config import MacroConfig
>>> describe(MacroConfig(ngram=5)), describe(MacroConfig(termination_condition="entropy"))
('fixed n=5', 'entropy (tau=2)')
"""

from __future__ import annotations

from marlhf.macro.config import MacroConfig


def describe(cfg: MacroConfig) -> str:
    """A short name of the rule: ``fixed n=5``, ``randomized 1,2,3,5,10``, ``entropy tau=2``..."""
    tc = cfg.termination_condition
    if tc == "fixed":
        return f"fixed n={cfg.ngram}"
    if tc == "randomized":
        return f"randomized {','.join(map(str, cfg.ngram_choices))}"
    if tc == "parsing":
        return f"parsing ({cfg.parser_backend}, cutoff {cfg.parsing_cutoff})"
    if tc == "ppl":
        return f"ppl (min {cfg.ppl_min_len}, max {cfg.ppl_max_len or 'unbounded'})"
    if cfg.target_macro_len is not None:
        return f"entropy (target length {cfg.target_macro_len:g})"
    return f"entropy (tau={cfg.entropy_threshold:g})"
