"""The registry of termination rules (``--termination_condition``): what a rule tells the rest of the
package about itself, and how it is found. Plain data and the standard library, no torch: the
configuration reads it, and ``--help`` and a flag's error come before torch is imported.

A rule is a class registered under its CLI name with ``@register_rule(name)``. It carries, as class
attributes and class methods of :class:`Rule`, everything the package asks of it: its one-line
``description`` (``--help``), the ``flags`` of :class:`~marlhf.macro.config.MacroConfig` it reads,
the optional `TerminationInputs` it ``needs``, whether it needs the policy's tokenizer, its
``validate`` (the flags it is given), its ``label`` in titles and run names, and the ``boundary``
token of its macro actions for ``--macro_credit boundary`` (:mod:`marlhf.macro.credit`). Built, it
answers a batch: ``__init__(cfg, tokenizer=None)`` reads the flags, ``__call__(inputs) ->
TerminationOutput`` (:mod:`marlhf.macro.termination`, which builds and calls it).

Where a rule lives:

- **a built-in rule** is declared here (its class with the metadata, and ``implementation =
  "package.module:Class"``) and implemented there, by a subclass that registers itself under the
  same name: the built-in rules in :mod:`marlhf.macro.termination`, ``parsing`` in
  :mod:`marlhf.macro.parsing.rule`. :func:`rule_implementation` imports the implementation when the
  rule is first built, and puts it in its entry's place;
- **a rule of one's own** is one class with both, in a file ``--plugin`` names
  (:mod:`marlhf.plugins`), which may import torch at its top: it is imported only when named.

Example: a rule of one's own (the metadata here; its ``__call__`` in ``docs/extending.md``), and a
built-in one, known before its module is imported.

>>> @register_rule("pairs_doc")
... class Pairs(Rule):
...     description = "macro actions of two tokens"
>>> from marlhf.macro.config import MacroConfig
>>> cfg = MacroConfig(termination_condition="pairs_doc")
>>> rule_class("pairs_doc").label(cfg), rule_class("pairs_doc").boundary(cfg)
('pairs_doc', 'first')
>>> rule_class("lowprob").label(MacroConfig(termination_condition="lowprob"))
'lowprob (p<0.5)'
>>> Parsing.implementation
'marlhf.macro.parsing.rule:ParsingRule'
>>> del RULES["pairs_doc"]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

from marlhf.plugins import declared_implementation

__all__ = [
    "INPUT_SOURCES",
    "RULES",
    "Entropy",
    "Fixed",
    "LowProb",
    "MacroFlags",
    "Parsing",
    "Ppl",
    "Randomized",
    "Rule",
    "Step",
    "Turn",
    "register_rule",
    "rule_class",
    "rule_implementation",
    "rules_help",
]


# what a rule is given: the run's `marlhf.macro.config.MacroConfig` (which imports this module, so
# it is named here, not imported)
MacroFlags = Any

# the optional per-token inputs a rule may need (`Rule.needs`), and where a caller gets each
INPUT_SOURCES = {
    "ref_logprobs": "the reference model",
    "ref_entropy": "the reference model",
    "old_logprobs": "the rollout's log-probs of its sampled tokens",
    "turn_end": "the multi-turn rollout of --env (each turn's last action token)",
}


class Rule:
    """A termination rule: a registered subclass answers a batch (``__init__(cfg, tokenizer=None)``
    reads the flags, ``__call__(inputs) -> TerminationOutput``) and tells the package about itself.
    ``cfg`` is the run's :class:`~marlhf.macro.config.MacroConfig`.

    Class attributes:
        name: the CLI name (set by :func:`register_rule`).
        description: one line, listed by ``--termination_condition``'s help.
        flags: the ``MacroConfig`` fields it reads (listed in the help; each must be a field).
        needs: the optional `TerminationInputs` fields it reads (``ref_logprobs``, ``ref_entropy``,
            ``old_logprobs``, ``turn_end``): the callers compute only those
            (:func:`marlhf.macro.termination.termination_inputs`).
        needs_tokenizer: it is built with the policy's tokenizer (a parser decodes the tokens).
        implementation: ``"package.module:Class"`` of the subclass that answers the batches,
            imported when the rule is first built (the built-in rules); None: this class answers.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    flags: ClassVar[tuple[str, ...]] = ()
    needs: frozenset[str] = frozenset()
    needs_tokenizer: ClassVar[bool] = False
    implementation: ClassVar[str | None] = None

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        pass

    def __call__(self, inputs: Any) -> Any:
        raise NotImplementedError(f"termination rule {self.name!r} answers no batch")

    @classmethod
    def validate(cls, cfg: MacroFlags) -> None:
        """Raise a ``ValueError`` naming the flag when the run's flags do not suit this rule
        (called when the config chooses it; the flags' own ranges are checked with the flags)."""

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        """The rule with its settings in titles, logs and run names: ``fixed n=5``."""
        return cls.name

    @classmethod
    def short_label(cls, cfg: MacroFlags) -> str:
        """The label after an estimator's in a run name (``MA-PPO n=5``): `label` unless shorter."""
        return cls.label(cfg)

    @classmethod
    def boundary(cls, cfg: MacroFlags) -> str:
        """``"first"`` or ``"last"``: the token of each macro action that ``--macro_credit
        boundary`` trains. ``first`` (default): the action taken at the state where the macro
        action begins; ``last``: a rule whose cut marks the token that ends it."""
        return "first"

    @classmethod
    def token_level(cls, cfg: MacroFlags) -> bool:
        """Whether these flags make every token its own macro action (then MA-PPO is PPO)."""
        return False


RULES: dict[str, type[Rule]] = {}


def register_rule(name: str) -> Callable[[type], type]:
    """Class decorator: register a rule under the CLI name ``name`` (a later registration under a
    name replaces the earlier one, in its place in the order ``--help`` lists: so a built-in's
    implementation takes its declaration's place). A class that does not derive from :class:`Rule`
    (any class with ``__init__(cfg, tokenizer=None)`` and ``__call__(inputs)``) is registered with
    `Rule`'s defaults for what it does not define."""

    def decorator(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError(f"register_rule({name!r}) decorates a class, got {cls!r}")
        registered = cls if issubclass(cls, Rule) else type(cls.__name__, (cls, Rule), {})
        registered.name = name
        RULES[name] = registered
        return cls

    return decorator


def rule_class(name: str) -> type[Rule]:
    """The class registered as ``name``: its metadata (for a built-in rule not yet built, its
    declaration: nothing is imported).

    Raises:
        ValueError: ``--termination_condition`` naming the registered rules.
    """
    if name not in RULES:
        raise ValueError(
            f"--termination_condition {name!r} is not a registered rule; known: {sorted(RULES)} "
            "(a rule of your own: name its file with --plugin)"
        )
    return RULES[name]


def rule_implementation(name: str) -> type[Rule]:
    """The class that answers rule ``name``, its declaration's implementation imported
    (:func:`marlhf.plugins.declared_implementation`); an unknown name: :func:`rule_class`'s error."""
    rule_class(name)
    return declared_implementation(RULES, name, "--termination_condition", "rule")


def rules_help() -> str:
    """The registered rules, one ``name: description (flags)`` each, for ``--help``."""
    items = []
    for name, cls in RULES.items():
        flags = f" ({', '.join('--' + f for f in cls.flags)})" if cls.flags else ""
        items.append(f"`{name}`: {cls.description or name}{flags}")
    return "; ".join(items)


# --------------------------------------------------------------------------------------------------
# the built-in rules, in the order --help lists them (implemented in marlhf.macro.termination and
# marlhf.macro.parsing.rule)


@register_rule("fixed")
class Fixed(Rule):
    """Fixed n-gram: a macro action ends after every ``--ngram`` valid tokens and at the last one."""

    description = "fixed n-gram"
    flags = ("ngram",)
    implementation = "marlhf.macro.termination:FixedRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"fixed n={cfg.ngram}"

    @classmethod
    def short_label(cls, cfg: MacroFlags) -> str:
        return f"n={cfg.ngram}"

    @classmethod
    def token_level(cls, cfg: MacroFlags) -> bool:
        return cfg.ngram == 1


@register_rule("randomized")
class Randomized(Rule):
    """Randomized n-gram lengths, drawn per row from ``--ngram_choices``."""

    description = "randomized lengths"
    flags = ("ngram_choices", "repeat_times", "randomized_mode")
    implementation = "marlhf.macro.termination:RandomizedRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"randomized {','.join(map(str, cfg.ngram_choices))}"


@register_rule("parsing")
class Parsing(Rule):
    """Constituency parsing (MA-RLHF Sec. 3.1); its parser backends are imported with it."""

    description = "constituency parsing"
    flags = (
        "parser_backend",
        "parsing_cutoff",
        "spacy_model",
        "benepar_model",
        "parse_workers",
        "ngram",
    )
    needs_tokenizer = True
    implementation = "marlhf.macro.parsing.rule:ParsingRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"parsing ({cfg.parser_backend}, cutoff {cfg.parsing_cutoff})"


@register_rule("ppl")
class Ppl(Rule):
    """A macro action ends where the next token would raise its perplexity under the reference."""

    needs: frozenset[str] = frozenset({"ref_logprobs"})
    description = "perplexity under the reference model"
    flags = ("ppl_min_len", "ppl_max_len")
    implementation = "marlhf.macro.termination:PplRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"ppl (min {cfg.ppl_min_len}, max {cfg.ppl_max_len or 'unbounded'})"


@register_rule("entropy")
class Entropy(Rule):
    """A macro action starts where the reference model's entropy exceeds a threshold."""

    needs: frozenset[str] = frozenset({"ref_entropy"})
    description = "reference-model entropy (Segment-PPO)"
    flags = ("entropy_threshold", "target_macro_len", "eos_own_macro")
    implementation = "marlhf.macro.termination:EntropyRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        if cfg.target_macro_len is not None:
            return f"entropy (target length {cfg.target_macro_len:g})"
        return f"entropy (tau={cfg.entropy_threshold:g})"


@register_rule("lowprob")
class LowProb(Rule):
    """Cut points at tokens of low sampled probability under the rollout policy."""

    needs: frozenset[str] = frozenset({"old_logprobs"})
    description = (
        "low sampled probability under the rollout policy (SPO's cutpoints, SAE's boundaries)"
    )
    flags = ("lowprob_threshold", "target_macro_len", "lowprob_cut", "eos_own_macro")
    implementation = "marlhf.macro.termination:LowProbRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        cut = "" if cfg.lowprob_cut == "after" else ", cut before"
        if cfg.target_macro_len is not None:
            return f"lowprob (target length {cfg.target_macro_len:g}{cut})"
        return f"lowprob (p<{cfg.lowprob_threshold:g}{cut})"

    @classmethod
    def boundary(cls, cfg: MacroFlags) -> str:
        # after: the low-probability token that ends the macro action; before: the one opening it
        return "last" if cfg.lowprob_cut == "after" else "first"


@register_rule("step")
class Step(Rule):
    """A reasoning step is one macro action: it ends at each match of ``--step_delimiter``."""

    description = "reasoning steps: a macro action ends at each --step_delimiter (a newline)"
    flags = ("step_delimiter", "eos_own_macro")
    needs_tokenizer = True
    implementation = "marlhf.macro.step:StepRule"

    @classmethod
    def validate(cls, cfg: MacroFlags) -> None:
        try:
            pattern = re.compile(cfg.step_delimiter)
        except re.error as err:
            raise ValueError(
                f"--step_delimiter {cfg.step_delimiter!r} is no regular expression: {err}"
            ) from None
        if pattern.fullmatch(""):
            raise ValueError(
                f"--step_delimiter {cfg.step_delimiter!r} matches the empty text: every position "
                "would end a step"
            )

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return "step" if cfg.step_delimiter == "\n" else f"step ({cfg.step_delimiter!r})"

    @classmethod
    def boundary(cls, cfg: MacroFlags) -> str:
        # the delimiter closes a step; the decision is the step's first token
        return "first"


@register_rule("turn")
class Turn(Rule):
    """Each policy turn of a multi-turn conversation (``--env``) is one macro action."""

    needs: frozenset[str] = frozenset({"turn_end"})
    description = "each policy turn of a multi-turn conversation (--env)"
    flags = ("eos_own_macro",)
    implementation = "marlhf.macro.termination:TurnRule"

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return "turn"
