"""Macro-action configuration: how responses are cut into macro actions and how they are aggregated.

Flag names follow the original MA-RLHF scripts (``--termination_condition``, ``--ngram``,
``--repeat_times``, ``--parser_cutoff``, ``--value_function``). Validation raises ``ValueError`` naming
the flag and never rewrites a value.

The values of ``--termination_condition`` are the registered rules (:mod:`marlhf.macro.rules`, no
torch: the built-in ones declared there and those of the ``--plugin`` files); its help lists them
with their descriptions, and the chosen rule validates the flags it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from marlhf.config import check_own_numbers, flag
from marlhf.macro.rules import RULES, rule_class, rules_help
from marlhf.plugins import load_plugins

LOWPROB_CUTS = ("after", "before")
MACRO_CREDITS = ("all", "boundary")
RANDOMIZED_MODES = ("original", "resample")
PARSER_BACKENDS = ("benepar", "spacy", "python")
VALUE_FUNCTIONS = ("equal", "position", "unit", "start")
MACRO_REWARD_AGGS = ("sum", "weighted")


@dataclass
class MacroConfig:
    """Macro-action termination (which tokens end a macro action) and aggregation (MA-PPO, Sec. 3)."""

    termination_condition: str = flag(
        "fixed",
        f"Rule that ends macro actions: {rules_help()}; or one a --plugin file registers.",
        choices=RULES,  # the registry itself: the rules --plugin files add count too
    )
    ngram: int = flag(
        1, "Tokens per macro action for `fixed` (1 = token-level PPO).", range="[1, inf)"
    )
    ngram_choices: tuple[int, ...] = flag(
        (1, 2, 3, 5, 10),
        "Macro-action lengths drawn by `randomized` (the released code uses 1,2,3,5,10; "
        "the paper text says 2,3,5,10).",
    )
    repeat_times: int = flag(
        1,
        "`randomized` (original mode): each length in --ngram_choices is used "
        "this many times before the remainder becomes one macro action.",
        range="[1, inf)",
    )
    randomized_mode: str = flag(
        "original",
        "`original`: shuffle ngram_choices*repeat_times once per response, remainder is "
        "one macro action; `resample`: draw lengths uniformly from the choices until the end.",
        choices=RANDOMIZED_MODES,
    )
    parsing_cutoff: int = flag(
        5,
        "`parsing`: a constituent with fewer tokens than this is one macro action.",
        aliases=("--parser_cutoff",),
        range="[1, inf)",
    )
    parser_backend: str = flag(
        "benepar",
        "`parsing`: constituency parser (benepar), spaCy dependency subtrees (spacy) "
        "or Python statements (python, for code).",
        choices=PARSER_BACKENDS,
    )
    spacy_model: str = flag("en_core_web_sm", "`parsing`: spaCy pipeline name or path.")
    benepar_model: str = flag("benepar_en3", "`parsing`: benepar model name or path.")
    parse_workers: int = flag(
        0, "`parsing`: worker processes for parsing (0 = parse in process).", range="[0, inf)"
    )
    ppl_min_len: int = flag(
        1, "`ppl`: minimum tokens in a macro action before it may end.", range="[1, inf)"
    )
    ppl_max_len: int = flag(
        0, "`ppl`: a macro action ends after this many tokens (0 = unbounded).", range="[0, inf)"
    )
    entropy_threshold: float = flag(
        2.0,
        "`entropy`: a macro action starts before a token whose reference-model entropy "
        "exceeds this (0 = token level, inf = one macro action).",
        range="[0, inf]",
    )
    target_macro_len: float | None = flag(
        None,
        "`entropy`, `lowprob`: if set, pick the threshold per batch so the mean "
        "macro-action length is about this (overrides --entropy_threshold, "
        "--lowprob_threshold).",
        range="[1, inf)",
    )
    lowprob_threshold: float = flag(
        0.5,
        "`lowprob`: a token whose sampled probability under the rollout policy is below "
        "this is a cut point (see --lowprob_cut); --target_macro_len overrides it.",
        range="(0, 1]",
    )
    lowprob_cut: str = flag(
        "after",
        "`lowprob`: a macro action ends at the low-probability token (after: where its "
        "macro action starts is known before the token is sampled, which keeps an exact-value "
        "advantage unbiased) or just before it (before: the low-probability token opens the "
        "next macro action, as the entropy rule does; biased, see "
        "docs/research/estimator-bias.md).",
        choices=LOWPROB_CUTS,
    )
    macro_credit: str = flag(
        "all",
        "Which tokens a macro action's advantage trains: all its tokens, or only its "
        "boundary token (SPO's probability mask): the low-probability token that ends it for "
        "`lowprob` (the first token with --lowprob_cut before), its first token for every "
        "other rule. For the per-macro estimators gae and macro_mc, with --ratio_level token.",
        choices=MACRO_CREDITS,
    )
    step_delimiter: str = flag(
        "\n",
        "`step`: the regular expression (Python's re) that ends a reasoning step; a macro "
        "action ends at the token holding the last character of each match (default: a newline).",
    )
    eos_own_macro: bool = flag(
        True,
        "The final EOS / end-of-conversation token is its own 1-token macro action "
        "(keeps the reward-model score from being mixed with KL terms; that macro action starts "
        "where the policy chose to stop, so even exact values give the stop decision a biased "
        "advantage: --no_eos_own_macro with --value_function start is unbiased).",
    )
    value_function: str = flag(
        "equal",
        "Weights sigma of token values in a macro value: equal (1/|w|), position "
        "(1/(j+1), normalised), unit (last token) or start (V of the state where the macro "
        "action begins: a baseline independent of the macro action, so the policy gradient "
        "stays unbiased).",
        choices=VALUE_FUNCTIONS,
    )
    macro_reward_agg: str = flag(
        "sum",
        "Macro reward: sum of token rewards (KL strength independent of n) or weighted "
        "with the value weights (the original; divides the KL penalty by about n; the final "
        "score stays whole when the trainer passes it apart from the KL rewards).",
        choices=MACRO_REWARD_AGGS,
    )

    plugin: tuple[str, ...] = flag(
        (),
        "Python files (path/to/rules.py) or modules (package.module) imported before "
        "the flags are checked, once each: the termination rules, advantage estimators, "
        "reward sources and generation backends they register become values of "
        "--termination_condition, --advantage_estimator, --reward_source and "
        "--generation_backend (docs/extending.md). Repeatable.",
        repeat=True,
        plugins=True,  # marlhf.cli imports them before it checks any flag
    )

    def __post_init__(self) -> None:
        check_own_numbers(self)
        load_plugins(self.plugin)  # a config read from a run's run_config.json names its plugins
        rule = rule_class(self.termination_condition)  # ValueError listing the registered rules
        names = {f.name for f in fields(self)}
        unknown = [name for name in rule.flags if name not in names]
        if unknown:
            raise ValueError(
                f"--termination_condition {self.termination_condition}: the rule reads {unknown}, "
                "which are no fields of MacroConfig"
            )
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices is not None and value not in choices:
                raise ValueError(f"--{f.name} must be one of {choices}, got {value!r}")
        if self.value_function == "start" and self.macro_reward_agg == "weighted":
            raise ValueError(
                "--value_function start with --macro_reward_agg weighted would keep only the "
                "first token's KL reward of each macro action; use --macro_reward_agg sum"
            )
        if len(self.ngram_choices) == 0 or any(int(n) < 1 for n in self.ngram_choices):
            raise ValueError(
                f"--ngram_choices must be a non-empty list of lengths >= 1, got {self.ngram_choices}"
            )
        if 0 < self.ppl_max_len < self.ppl_min_len:
            raise ValueError(
                f"--ppl_max_len ({self.ppl_max_len}) must be 0 or >= --ppl_min_len "
                f"({self.ppl_min_len})"
            )
        rule.validate(self)
