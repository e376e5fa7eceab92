"""marlhf.macro.rules: a termination rule carries what the package asks of it (description, flags,
label, boundary, validation, inputs), the parsing rule is imported on first use, and one builder
gives a rule the inputs it reads."""

import dataclasses
import doctest
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import marlhf.macro.rules as rules_module
from marlhf.macro.config import MacroConfig
from marlhf.macro.credit import boundary_tokens
from marlhf.macro.naming import describe
from marlhf.macro.rules import RULES, Rule, register_rule, rule_class, rules_help
from marlhf.macro.segments import build_segments
from marlhf.macro.termination import TerminationOutput, build_termination, termination_inputs

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = ("fixed", "randomized", "parsing", "ppl", "entropy", "lowprob", "step", "turn")


@pytest.fixture
def registry():
    """The rules a test registers leave the registry afterwards."""
    saved = dict(RULES)
    yield RULES
    RULES.clear()
    RULES.update(saved)


def test_doctests():
    assert doctest.testmod(rules_module).failed == 0


def test_the_built_in_rules_in_the_flag_order_describe_themselves():
    assert tuple(RULES)[: len(BUILT_IN)] == BUILT_IN
    names = {f.name for f in dataclasses.fields(MacroConfig)}
    text = rules_help()
    help_text = {f.name: f for f in dataclasses.fields(MacroConfig)}["termination_condition"]
    for name in BUILT_IN:
        cls = rule_class(name)
        assert cls.name == name and cls.description, name
        assert set(cls.flags) <= names and cls.flags, name
        listed = f"`{name}`: {cls.description} ({', '.join('--' + f for f in cls.flags)})"
        assert listed in text and listed in help_text.metadata["help"]
    assert rule_class("parsing").needs_tokenizer and rule_class("step").needs_tokenizer
    assert [n for n in BUILT_IN if rule_class(n).needs] == ["ppl", "entropy", "lowprob", "turn"]


@pytest.mark.parametrize(
    "kwargs, label",
    [
        ({"ngram": 5}, "fixed n=5"),
        ({"termination_condition": "randomized", "ngram_choices": (2, 3)}, "randomized 2,3"),
        (
            {"termination_condition": "parsing", "parser_backend": "python", "parsing_cutoff": 4},
            "parsing (python, cutoff 4)",
        ),
        ({"termination_condition": "ppl", "ppl_max_len": 6}, "ppl (min 1, max 6)"),
        ({"termination_condition": "ppl"}, "ppl (min 1, max unbounded)"),
        ({"termination_condition": "entropy", "entropy_threshold": 1.5}, "entropy (tau=1.5)"),
        (
            {"termination_condition": "entropy", "target_macro_len": 4.0},
            "entropy (target length 4)",
        ),
        ({"termination_condition": "lowprob"}, "lowprob (p<0.5)"),
        (
            {"termination_condition": "lowprob", "lowprob_cut": "before"},
            "lowprob (p<0.5, cut before)",
        ),
    ],
)
def test_each_rule_labels_itself(kwargs, label):
    assert describe(MacroConfig(**kwargs)) == label


def test_token_level_is_fixed_with_n_1_only():
    assert rule_class("fixed").token_level(MacroConfig(ngram=1))
    assert not rule_class("fixed").token_level(MacroConfig(ngram=2))
    cfg = MacroConfig(termination_condition="randomized", ngram_choices=(1,))
    assert not rule_class("randomized").token_level(cfg)


class Halves(Rule):
    """A rule of a test's: each response cut in two (the first half, then the rest)."""

    description = "two halves"
    flags = ("ngram",)

    @classmethod
    def validate(cls, cfg):
        if cfg.ngram != 2:
            raise ValueError(
                f"--termination_condition halves cuts in 2: --ngram must be 2, got {cfg.ngram}"
            )

    @classmethod
    def label(cls, cfg):
        return "halves"

    @classmethod
    def boundary(cls, cfg):
        return "last"

    def __call__(self, inputs):
        mask = inputs.action_mask
        n = mask.sum(1, keepdim=True)
        pos = torch.arange(mask.shape[1])[None, :]
        return TerminationOutput(macro_end=(pos == (n - 1) // 2) & mask)


def test_a_registered_rule_is_a_value_with_its_label_boundary_and_validation(registry):
    register_rule("halves")(Halves)
    cfg = MacroConfig(termination_condition="halves", ngram=2, eos_own_macro=False)
    assert describe(cfg) == "halves" and "`halves`: two halves (--ngram)" in rules_help()
    with pytest.raises(ValueError, match="--ngram must be 2, got 3"):
        MacroConfig(termination_condition="halves", ngram=3)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]).bool()
    rule = build_termination(cfg)
    ends = rule(termination_inputs(rule, torch.zeros(2, 6), mask, torch.tensor([True, False])))
    assert ends.macro_end.int().tolist() == [[0, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 0]]
    # --macro_credit boundary trains the last token of each half (the rule's boundary)
    seg = build_segments(ends.macro_end, mask)
    assert boundary_tokens(seg, cfg).int().tolist() == ends.macro_end.int().tolist()


def test_an_unknown_rule_or_flag_is_an_error_naming_the_flag(registry):
    with pytest.raises(ValueError, match=r"--termination_condition 'halves' is not a registered"):
        MacroConfig(termination_condition="halves")

    class ReadsNothingThere(Rule):
        flags = ("ngram", "window")

    register_rule("window")(ReadsNothingThere)
    with pytest.raises(ValueError, match=r"the rule reads \['window'\], which are no fields"):
        MacroConfig(termination_condition="window")


def test_a_class_not_derived_from_rule_gets_the_defaults(registry):
    class Plain:
        needs = frozenset()

        def __init__(self, cfg, tokenizer=None):
            pass

        def __call__(self, inputs):
            return TerminationOutput(macro_end=inputs.action_mask.clone())

    assert register_rule("plain")(Plain) is Plain
    cfg = MacroConfig(termination_condition="plain")
    cls = rule_class("plain")
    assert issubclass(cls, Plain) and issubclass(cls, Rule)
    assert (cls.label(cfg), cls.boundary(cfg), cls.token_level(cfg)) == ("plain", "first", False)
    with pytest.raises(TypeError, match="decorates a class"):
        register_rule("f")(lambda cfg, tokenizer=None: None)


def test_a_rule_whose_implementation_cannot_be_imported_says_so(registry):
    class Elsewhere(Rule):
        description = "implemented elsewhere"
        implementation = "no_such_module_xyz.rules:Thing"

    register_rule("elsewhere")(Elsewhere)
    cfg = MacroConfig(termination_condition="elsewhere")  # its metadata is enough to validate
    assert describe(cfg) == "elsewhere"
    with pytest.raises(ValueError, match="elsewhere: its implementation no_such_module_xyz"):
        build_termination(cfg)


def test_the_parsing_rule_imports_its_backends_only_when_built():
    code = (
        "import sys\n"
        "from marlhf.macro import MacroConfig, build_termination, RULES\n"
        "from marlhf.macro.naming import describe\n"
        "cfg = MacroConfig(termination_condition='parsing', parser_backend='python')\n"
        "print(describe(cfg))\n"
        "print(sorted(m for m in sys.modules if m.startswith('marlhf.macro.parsing')))\n"
        "rule = build_termination(cfg, tokenizer=object())\n"
        "from marlhf.macro.parsing import ParsingRule\n"
        "print(RULES['parsing'] is ParsingRule, type(rule.rule).__name__)\n"
        "try:\n"
        "    build_termination(cfg)\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "parsing (python, cutoff 5)",
        "[]",
        "True ParsingRule",
        "--termination_condition parsing needs the policy tokenizer",
    ]


class _Needs(Rule):
    needs = frozenset({"ref_entropy"})


def test_the_builder_gives_a_rule_only_what_it_reads():
    mask = torch.ones(2, 3, dtype=torch.bool)
    ids, eos = torch.zeros(2, 3, dtype=torch.long), torch.tensor([True, False])
    entropy = torch.rand(2, 3)
    calls = []

    def compute_entropy():
        calls.append("ref_entropy")
        return entropy

    def never():
        raise AssertionError("a quantity the rule does not read was computed")

    seeds = torch.tensor([1, 2])
    inputs = termination_inputs(
        _Needs(None),
        ids,
        mask,
        eos,
        ref_logprobs=never,
        ref_entropy=compute_entropy,
        old_logprobs=torch.zeros(2, 3),
        row_seeds=seeds,
    )
    assert calls == ["ref_entropy"] and inputs.ref_entropy is entropy
    assert inputs.ref_logprobs is None and inputs.old_logprobs is None
    assert inputs.row_seeds is seeds and inputs.action_mask is mask
    with pytest.raises(
        ValueError, match="needs TerminationInputs.ref_entropy; compute it from the reference"
    ):
        termination_inputs(_Needs(None), ids, mask, eos, ref_entropy=lambda: None)
    lowprob = build_termination(MacroConfig(termination_condition="lowprob"))
    with pytest.raises(ValueError, match="'lowprob' needs TerminationInputs.old_logprobs.*rollout"):
        termination_inputs(lowprob, ids, mask, eos, ref_logprobs=torch.zeros(2, 3))
