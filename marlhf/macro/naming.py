"""A short name of a macro-action rule, for titles, logs and run names: the rule's own label
(:meth:`marlhf.macro.rules.Rule.label`).

>>> from marlhf.macro.config import MacroConfig
>>> describe(MacroConfig(ngram=5)), describe(MacroConfig(termination_condition="entropy"))
('fixed n=5', 'entropy (tau=2)')
>>> describe(MacroConfig(termination_condition="lowprob", lowprob_threshold=0.3))
'lowprob (p<0.3)'

"""

from __future__ import annotations

from marlhf.macro.config import MacroConfig
from marlhf.macro.rules import rule_class


def describe(cfg: MacroConfig) -> str:
    """A short name of the rule: ``fixed n=5``, ``randomized 1,2,3,5,10``, ``entropy (tau=2)``,
    ``lowprob (p<0.5)``..."""
    return rule_class(cfg.termination_condition).label(cfg)
