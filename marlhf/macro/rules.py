"""The registry of termination rules (``--termination_condition``): what a rule reads and answers,
what it tells the rest of the package about itself, and how it is found, built and called.

A rule is a class registered under its CLI name with ``@register_rule(name)``. It carries, as class
attributes and class methods of :class:`Rule`, everything the package asks of it: its one-line
``description`` (``--help``), the ``flags`` of :class:`~marlhf.macro.config.MacroConfig` it reads,
the optional `TerminationInputs` it ``needs``, whether it needs the policy's tokenizer, its
``validate`` (the flags it is given), its ``label`` in titles and run names, and the ``boundary``
token of its macro actions for ``--macro_credit boundary`` (:mod:`marlhf.macro.credit`). The
built-in rules are :mod:`marlhf.macro.termination`; a user's rule registers from a file named by
``--plugin`` (:mod:`marlhf.plugins`).

A rule whose module is costly to import registers a light class with the metadata and
``implementation = "package.module:Class"``: its name, description and validation are known at
once, and the module, which registers ``Class`` (a subclass) under the same name, is imported when
the rule is first built (the ``parsing`` rule and its parser backends).

Example: a rule of one's own (every macro action 2 tokens, with ``--eos_own_macro``) and its label.

>>> import torch
>>> @register_rule("pairs_doc")
... class Pairs(Rule):
...     description = "macro actions of two tokens"
...     def __call__(self, inputs):
...         pos = torch.arange(inputs.action_mask.shape[1]).expand_as(inputs.action_mask)
...         return TerminationOutput(macro_end=(pos % 2 == 1) & inputs.action_mask)
>>> from marlhf.macro.config import MacroConfig
>>> cfg = MacroConfig(termination_condition="pairs_doc")
>>> rule_class("pairs_doc").label(cfg), rule_class("pairs_doc").boundary(cfg)
('pairs_doc', 'first')
>>> mask = torch.ones(1, 5, dtype=torch.bool)
>>> inputs = termination_inputs(build_termination(cfg), torch.zeros(1, 5), mask, torch.tensor([True]))
>>> build_termination(cfg)(inputs).macro_end.int().tolist()
[[0, 1, 0, 1, 1]]
>>> del RULES["pairs_doc"]
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

__all__ = [
    "INPUT_SOURCES",
    "RULES",
    "MacroFlags",
    "Rule",
    "TerminationInputs",
    "TerminationOutput",
    "TerminationRule",
    "build_termination",
    "register_rule",
    "rule_class",
    "rules_help",
    "termination_inputs",
]


# what a rule is given: the run's `marlhf.macro.config.MacroConfig` (which imports this module, so
# it is named here, not imported)
MacroFlags = Any


@dataclass
class TerminationInputs:
    """What a termination rule may look at, for a right-padded batch of responses
    (:func:`termination_inputs` builds it for a rule).

    Fields:
        response_ids: (B, A) long — sampled response tokens.
        action_mask: (B, A) bool — response tokens, true on a prefix of each row.
        ends_with_eos: (B,) bool — the last valid token is EOS / end-of-conversation (false for
            responses truncated at the length limit).
        ref_logprobs: (B, A) float | None — log p_ref(a_t | s_t) of each sampled token (``ppl``).
        ref_entropy: (B, A) float | None — entropy of p_ref( . | s_t), the distribution token t was
            sampled from (``entropy``).
        generator: torch.Generator | None — randomness for ``randomized`` without ``row_seeds``: the
            rows' seeds are drawn from it (None: torch's default generator).
        row_seeds: (B,) long | None — ``randomized``: row b's lengths are drawn from a generator
            seeded with ``row_seeds[b]``, so they depend on nothing else in the batch (not its other
            rows, its width or its split over ranks); the trainer derives them with `marlhf.runtime.rows.derive_row_seeds`.
        all_gather: ``(x, pad_value) -> x of every data-parallel rank, concatenated on dim 0`` (widths
            right-padded with ``pad_value``; `marlhf.runtime.distributed.all_gather_padded`) | None — a rule
            that chooses a batch-level value (``entropy`` with ``--target_macro_len``: tau) chooses it
            over all ranks' rows, so every rank segments as one process with the whole batch would.
            None: this batch is the whole batch. A collective: every rank calls the rule.
        old_logprobs: (B, A) float | None — log π_old(a_t | s_t) of each sampled token at the
            sampling temperature, as the rollout recorded it (``lowprob``).
    """

    response_ids: torch.Tensor
    action_mask: torch.Tensor
    ends_with_eos: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    ref_entropy: torch.Tensor | None = None
    generator: torch.Generator | None = None
    row_seeds: torch.Tensor | None = None
    all_gather: Callable[[torch.Tensor, Any], torch.Tensor] | None = None
    old_logprobs: torch.Tensor | None = None


# the optional per-token inputs a rule may need (`Rule.needs`), and where a caller gets each
INPUT_SOURCES = {
    "ref_logprobs": "the reference model",
    "ref_entropy": "the reference model",
    "old_logprobs": "the rollout's log-probs of its sampled tokens",
}


@dataclass
class TerminationOutput:
    """A rule's answer.

    Fields:
        macro_end: (B, A) bool — true on the last token of each macro action, false on padding.
        fallback: (B,) bool — rows where the rule failed and ``fixed`` was used instead (only
            ``parsing`` sets it); None means all false.
        stats: batch-level values the rule chose, to log with the ``macro/*`` metrics (``entropy``:
            ``macro/entropy_threshold``, the tau it used).
    """

    macro_end: torch.Tensor
    fallback: torch.Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fallback is None:
            self.fallback = torch.zeros(
                self.macro_end.shape[0], dtype=torch.bool, device=self.macro_end.device
            )


class TerminationRule(Protocol):
    """A batched termination rule, as built: `needs` names the optional `TerminationInputs` fields
    it reads."""

    needs: frozenset[str]

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput: ...


class Rule:
    """A termination rule: a registered subclass answers a batch (``__init__(cfg, tokenizer=None)``
    reads the flags, ``__call__(inputs) -> TerminationOutput``) and tells the package about itself.
    ``cfg`` is the run's :class:`~marlhf.macro.config.MacroConfig`.

    Class attributes:
        name: the CLI name (set by :func:`register_rule`).
        description: one line, listed by ``--termination_condition``'s help.
        flags: the ``MacroConfig`` fields it reads (listed in the help; each must be a field).
        needs: the optional `TerminationInputs` fields it reads (``ref_logprobs``, ``ref_entropy``,
            ``old_logprobs``): the callers compute only those (:func:`termination_inputs`).
        needs_tokenizer: it is built with the policy's tokenizer (a parser decodes the tokens).
        implementation: ``"package.module:Class"`` of a light metadata class whose rule lives in
            a module imported on first use (``Class`` registers itself under the same name).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    flags: ClassVar[tuple[str, ...]] = ()
    needs: frozenset[str] = frozenset()
    needs_tokenizer: ClassVar[bool] = False
    implementation: ClassVar[str | None] = None

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        pass

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
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
    name replaces the earlier one). A class that does not derive from :class:`Rule` (any class with
    ``__init__(cfg, tokenizer=None)`` and ``__call__(inputs)``) is registered with `Rule`'s
    defaults for what it does not define."""

    def decorator(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError(f"register_rule({name!r}) decorates a class, got {cls!r}")
        registered = cls if issubclass(cls, Rule) else type(cls.__name__, (cls, Rule), {})
        registered.name = name
        RULES[name] = registered
        return cls

    return decorator


def rule_class(name: str) -> type[Rule]:
    """The class registered as ``name`` (for a rule implemented on first use, its metadata class:
    nothing is imported).

    Raises:
        ValueError: ``--termination_condition`` naming the registered rules.
    """
    if name not in RULES:
        raise ValueError(
            f"--termination_condition {name!r} is not a registered rule; known: {sorted(RULES)} "
            "(a rule of your own: name its file with --plugin)"
        )
    return RULES[name]


def _implementation(name: str) -> type[Rule]:
    """The class that answers rule ``name``: imports its module first when it is implemented on
    first use."""
    cls = rule_class(name)
    target = cls.__dict__.get("implementation")
    if target is None:
        return cls
    module, _, attr = target.partition(":")
    try:
        impl = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"--termination_condition {name}: its implementation {target} cannot be imported "
            f"({type(err).__name__}: {err})"
        ) from err
    if RULES.get(name) is not impl:
        raise TypeError(f"{target} does not register itself as rule {name!r}")
    return impl


def rules_help() -> str:
    """The registered rules, one ``name: description (flags)`` each, for ``--help``."""
    items = []
    for name, cls in RULES.items():
        flags = f" ({', '.join('--' + f for f in cls.flags)})" if cls.flags else ""
        items.append(f"`{name}`: {cls.description or name}{flags}")
    return "; ".join(items)


def _missing(rule_name: str, name: str) -> ValueError:
    return ValueError(
        f"termination rule {rule_name!r} needs TerminationInputs.{name}; compute it from "
        f"{INPUT_SOURCES.get(name, 'its source')} and pass it"
    )


def termination_inputs(
    rule: TerminationRule,
    response_ids: torch.Tensor,
    action_mask: torch.Tensor,
    ends_with_eos: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | Callable[[], torch.Tensor] | None = None,
    ref_entropy: torch.Tensor | Callable[[], torch.Tensor] | None = None,
    old_logprobs: torch.Tensor | Callable[[], torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
    row_seeds: torch.Tensor | None = None,
    all_gather: Callable[[torch.Tensor, Any], torch.Tensor] | None = None,
) -> TerminationInputs:
    """The `TerminationInputs` of a batch for ``rule`` (as built by :func:`build_termination`):
    the three fields every rule reads, of the optional per-token quantities those ``rule.needs``
    (each given as a (B, A) tensor or as a zero-argument callable computing it, called only when the
    rule reads it; the others are left None), and the batch helpers as given.

    Raises:
        ValueError: a quantity the rule needs is not given (naming where it comes from).
    """
    needs = frozenset(getattr(rule, "needs", frozenset()))
    given = {"ref_logprobs": ref_logprobs, "ref_entropy": ref_entropy, "old_logprobs": old_logprobs}
    per_token = {}
    for name, value in given.items():
        if name not in needs:
            continue
        value = value() if callable(value) else value
        if value is None:
            raise _missing(getattr(rule, "name", type(rule).__name__), name)
        per_token[name] = value
    return TerminationInputs(
        response_ids=response_ids,
        action_mask=action_mask,
        ends_with_eos=ends_with_eos,
        generator=generator,
        row_seeds=row_seeds,
        all_gather=all_gather,
        **per_token,
    )


# --------------------------------------------------------------------------------------------------
# building


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """(B, A) long token index 0..A-1."""
    return torch.arange(mask.shape[1], device=mask.device).expand_as(mask)


def _last_valid(mask: torch.Tensor) -> torch.Tensor:
    """(B, A) bool — true on the last valid token of each non-empty row."""
    n_valid = mask.sum(1, keepdim=True)
    return _positions(mask) == (n_valid - 1)


class _CheckedRule:
    """A registered rule plus input validation and the ``--eos_own_macro`` convention."""

    def __init__(self, name: str, rule: TerminationRule, eos_own_macro: bool) -> None:
        self.name = name
        self.rule = rule
        self.needs: frozenset[str] = frozenset(getattr(rule, "needs", frozenset()))
        self.eos_own_macro = eos_own_macro

    def __repr__(self) -> str:
        return f"TerminationRule({self.name!r}, eos_own_macro={self.eos_own_macro})"

    def _check(self, inputs: TerminationInputs) -> None:
        mask = inputs.action_mask
        if mask.dim() != 2 or mask.dtype != torch.bool:
            raise ValueError(
                f"action_mask must be a (B, A) bool tensor, got {mask.dtype} {tuple(mask.shape)}"
            )
        B, A = mask.shape
        if tuple(inputs.response_ids.shape) != (B, A):
            raise ValueError(
                f"response_ids {tuple(inputs.response_ids.shape)} must match action_mask {(B, A)}"
            )
        if tuple(inputs.ends_with_eos.shape) != (B,):
            raise ValueError(f"ends_with_eos {tuple(inputs.ends_with_eos.shape)} must be ({B},)")
        if A > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise ValueError("action_mask must be right-padded (true on a prefix of each row)")
        if inputs.row_seeds is not None and tuple(inputs.row_seeds.shape) != (B,):
            raise ValueError(f"row_seeds {tuple(inputs.row_seeds.shape)} must be ({B},)")
        for name in sorted(self.needs):
            value = getattr(inputs, name, None)
            if value is None:
                raise _missing(self.name, name)
            if isinstance(value, torch.Tensor) and tuple(value.shape) != (B, A):
                raise ValueError(
                    f"TerminationInputs.{name} {tuple(value.shape)} must match action_mask {(B, A)}"
                )

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        self._check(inputs)
        out = self.rule(inputs)
        mask = inputs.action_mask
        last = _last_valid(mask) & mask
        macro_end = (out.macro_end.bool() | last) & mask
        if self.eos_own_macro:
            # The token before a final EOS ends a macro action, so the EOS stands alone.
            n_valid = mask.sum(1)
            own = inputs.ends_with_eos.bool().to(mask.device) & (n_valid >= 2)
            before_last = _positions(mask) == (n_valid - 2)[:, None]
            macro_end = macro_end | (before_last & own[:, None])
        return TerminationOutput(macro_end=macro_end, fallback=out.fallback, stats=out.stats)


def build_termination(cfg: MacroFlags, tokenizer: Any = None) -> TerminationRule:
    """The rule named by ``cfg.termination_condition`` (a ``MacroConfig``), with input checks and
    ``--eos_own_macro``.

    Raises:
        ValueError: unknown rule name (lists the registered ones); a rule that needs the policy's
            tokenizer built without one.
    """
    name = cfg.termination_condition
    cls = _implementation(name)
    if cls.needs_tokenizer and tokenizer is None:
        raise ValueError(f"--termination_condition {name} needs the policy tokenizer")
    return _CheckedRule(name, cls(cfg, tokenizer), cfg.eos_own_macro)
