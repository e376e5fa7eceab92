"""The built-in termination rules: which response tokens end a macro action (MA-RLHF Sec. 3.1),
batched, each with what it tells the package about itself (:class:`marlhf.macro.rules.Rule`).

Every rule maps a right-padded batch of responses to `macro_end: (B, A) bool`, true on the last token of
each macro action and always on the last valid token. Rules are looked up by their CLI name in `RULES`
(``--termination_condition``, :mod:`marlhf.macro.rules`); `build_termination` wraps the chosen rule
with input checks and the ``--eos_own_macro`` convention. The ``parsing`` rule is registered here by
its metadata; its implementation (:mod:`marlhf.macro.parsing`, with the parser backends) is imported
when it is first built.

Example: fixed 2-grams over a batch of two responses; the first ends with EOS, which becomes its own
macro action.

>>> import torch
>>> from marlhf.macro.config import MacroConfig
>>> rule = build_termination(MacroConfig(termination_condition="fixed", ngram=2))
>>> mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
>>> inputs = TerminationInputs(
...     response_ids=torch.zeros(2, 6, dtype=torch.long),
...     action_mask=mask,
...     ends_with_eos=torch.tensor([True, False]),
... )
>>> rule(inputs).macro_end.int().tolist()
[[0, 1, 0, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
"""

from __future__ import annotations

import math
from typing import Any

import torch

from marlhf.macro.rules import (
    RULES,
    MacroFlags,
    Rule,
    TerminationInputs,
    TerminationOutput,
    TerminationRule,
    _last_valid,
    _positions,
    build_termination,
    register_rule,
    rule_class,
    rules_help,
    termination_inputs,
)

__all__ = [
    "RULES",
    "EntropyRule",
    "FixedRule",
    "LowProbRule",
    "ParsingEntry",
    "PplRule",
    "RandomizedRule",
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


# --------------------------------------------------------------------------------------------------
# helpers


def _ends_from_lengths(lengths: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mark the ends of consecutive macro actions of the given lengths, then the last valid token.

    Args:
        lengths: (B, K) long >= 1 — macro-action lengths in order; the ones running past the end
            of the response are ignored.
        mask: (B, A) bool.

    Returns:
        (B, A) bool macro_end.
    """
    B, A = mask.shape
    ends = torch.cumsum(lengths, dim=1) - 1  # (B, K) token index of each macro action's last token
    n_valid = mask.sum(1, keepdim=True)
    inside = ends < n_valid
    macro_end = torch.zeros(B, A + 1, dtype=torch.bool, device=mask.device)
    # Ends past the response go to the spare column A, which is dropped.
    macro_end.scatter_(1, torch.where(inside, ends, torch.full_like(ends, A)), True)
    return (macro_end[:, :A] | _last_valid(mask)) & mask


# --------------------------------------------------------------------------------------------------
# rules


@register_rule("fixed")
class FixedRule(Rule):
    """Fixed n-gram: a macro action ends after every `--ngram` valid tokens and at the last one.

    ``n = 1`` makes every token its own macro action, so MA-PPO is exactly token-level PPO (the original
    added a spurious zero-length step when (T-1) % n == 0; this does not).
    """

    needs: frozenset[str] = frozenset()
    description = "fixed n-gram"
    flags = ("ngram",)

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"fixed n={cfg.ngram}"

    @classmethod
    def short_label(cls, cfg: MacroFlags) -> str:
        return f"n={cfg.ngram}"

    @classmethod
    def token_level(cls, cfg: MacroFlags) -> bool:
        return cfg.ngram == 1

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.n = cfg.ngram

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        macro_end = ((_positions(mask) + 1) % self.n == 0) | _last_valid(mask)
        return TerminationOutput(macro_end=macro_end & mask)


@register_rule("randomized")
class RandomizedRule(Rule):
    """Randomized n-gram lengths, each row its own draw from its own generator ``g_b`` seeded with
    ``inputs.row_seeds[b]`` (without row seeds, they are ``torch.randint(2**32, (B,),
    generator=inputs.generator)``). A row's macro actions depend only on its seed and its length.

    ``--randomized_mode original`` (the released code): the list ``ngram_choices * repeat_times`` (K
    lengths) is shuffled per row — the permutation is ``torch.rand(K, generator=g_b).argsort()`` — and
    consumed as consecutive macro-action lengths; once exhausted, the rest of the response is ONE macro
    action.

    ``--randomized_mode resample``: lengths are drawn uniformly from ``ngram_choices`` until the end of
    the response — ``torch.randint(len(ngram_choices), (n_b,), generator=g_b)`` indexes the choices,
    ``n_b`` the row's number of tokens (enough, as every length is >= 1).

    One small draw per row (a Python loop over B): the price of a draw that does not depend on which
    rows share the batch — the data-parallel split of the global batch included.
    """

    needs: frozenset[str] = frozenset()
    description = "randomized lengths"
    flags = ("ngram_choices", "repeat_times", "randomized_mode")

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"randomized {','.join(map(str, cfg.ngram_choices))}"

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.choices = torch.tensor([int(n) for n in cfg.ngram_choices], dtype=torch.long)
        self.repeat_times = cfg.repeat_times
        self.mode = cfg.randomized_mode

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        B, A = mask.shape
        seeds = inputs.row_seeds
        if seeds is None:
            g = inputs.generator
            device = g.device if g is not None else torch.device("cpu")
            seeds = torch.randint(2**32, (B,), generator=g, device=device)
        pool = self.choices.repeat(self.repeat_times)  # (K,) choices * repeat_times, as a list
        width = pool.numel() if self.mode == "original" else max(A, 1)
        # (B, K) lengths; in resample mode the 1s after a row's n_b draws lie past its end
        lengths = torch.ones(B, width, dtype=torch.long)
        for b, (seed, n) in enumerate(zip(seeds.tolist(), mask.sum(1).tolist(), strict=True)):
            g_b = torch.Generator().manual_seed(seed)
            if self.mode == "original":
                lengths[b] = pool[torch.rand(pool.numel(), generator=g_b).argsort()]
            else:
                lengths[b, :n] = self.choices[torch.randint(len(self.choices), (n,), generator=g_b)]
        return TerminationOutput(macro_end=_ends_from_lengths(lengths.to(mask.device), mask))


@register_rule("parsing")
class ParsingEntry(Rule):
    """Constituency parsing (MA-RLHF Sec. 3.1): the rule's metadata; the rule itself,
    :class:`marlhf.macro.parsing.rule.ParsingRule` (a subclass), is imported with its parser
    backends when it is first built."""

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
class PplRule(Rule):
    """Perplexity rule over the reference model's token NLLs, nll_t = -log p_ref(a_t | s_t).

    Scanning left to right, the current macro action holds tokens with running mean NLL m (its
    perplexity is exp(m)). Token t (t >= 1) starts a new macro action — i.e. token t-1 ends one — when

        (nll_t > m  and  current length >= --ppl_min_len)  or  (--ppl_max_len > 0 and
        current length >= --ppl_max_len),

    i.e. when adding t would raise the macro action's perplexity. The last valid token always ends a
    macro action. (The original intended ppl_{t+1} > ppl_t between neighbours, but its code could never
    fire.) Loops over A with batched tensor ops, never over rows.
    """

    needs: frozenset[str] = frozenset({"ref_logprobs"})
    description = "perplexity under the reference model"
    flags = ("ppl_min_len", "ppl_max_len")

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        return f"ppl (min {cfg.ppl_min_len}, max {cfg.ppl_max_len or 'unbounded'})"

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.min_len = cfg.ppl_min_len
        self.max_len = cfg.ppl_max_len

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        assert inputs.ref_logprobs is not None
        nll = -inputs.ref_logprobs.detach().to(torch.float64)
        B, A = mask.shape
        starts = torch.zeros(B, A, dtype=torch.bool, device=mask.device)  # token t starts a macro
        if A > 0:
            cur_sum = nll[:, 0].clone()
            cur_len = torch.ones(B, dtype=torch.long, device=mask.device)
            for t in range(1, A):
                x = nll[:, t]
                cut = (x > cur_sum / cur_len) & (cur_len >= self.min_len)
                if self.max_len > 0:
                    cut = cut | (cur_len >= self.max_len)
                starts[:, t] = cut
                cur_sum = torch.where(cut, x, cur_sum + x)
                cur_len = torch.where(cut, torch.ones_like(cur_len), cur_len + 1)
        macro_end = torch.zeros_like(starts)
        macro_end[:, :-1] = starts[:, 1:]
        return TerminationOutput(macro_end=(macro_end | _last_valid(mask)) & mask)


@register_rule("entropy")
class EntropyRule(Rule):
    """Entropy segmentation (Segment-PPO, arXiv 2501.02790): a new macro action starts before token j
    (j >= 1) when the reference model was uncertain there, H_j > tau; then token j-1 ends a macro action.

    tau = ``--entropy_threshold``: 0 gives token level (for positive entropies), inf one macro action.
    With ``--target_macro_len L*`` tau is chosen per batch: with N valid tokens, R non-empty rows and F
    boundaries forced by ``--eos_own_macro``, the K = round(N / L*) - R - F highest candidate entropies
    (tokens j >= 1, excluding a forced EOS) become boundaries — tau is the (K+1)-th highest — so the
    pooled mean length N / #macros is about L* (exact without ties). With ``inputs.all_gather`` the
    batch is every data-parallel rank's rows: all ranks choose the tau of one process with the whole
    batch. The tau used is reported as ``macro/entropy_threshold`` (inf when no boundary is wanted,
    -inf when every candidate is one).
    """

    needs: frozenset[str] = frozenset({"ref_entropy"})
    description = "reference-model entropy (Segment-PPO)"
    flags = ("entropy_threshold", "target_macro_len", "eos_own_macro")

    @classmethod
    def label(cls, cfg: MacroFlags) -> str:
        if cfg.target_macro_len is not None:
            return f"entropy (target length {cfg.target_macro_len:g})"
        return f"entropy (tau={cfg.entropy_threshold:g})"

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.threshold = cfg.entropy_threshold
        self.target = cfg.target_macro_len
        self.eos_own_macro = cfg.eos_own_macro

    def threshold_for(self, inputs: TerminationInputs) -> float:
        """tau used for this batch (the fixed threshold, or the one meeting --target_macro_len), over
        all ranks' rows when ``inputs.all_gather`` is given."""
        if self.target is None:
            return self.threshold
        mask, ends, entropy = inputs.action_mask, inputs.ends_with_eos, inputs.ref_entropy
        assert entropy is not None
        if inputs.all_gather is not None:
            # tau depends only on the multiset of (row length, EOS, candidate entropies), not on the
            # rows' order: the rank-major gathered rows give the tau of one process
            mask = inputs.all_gather(mask, False)
            ends = inputs.all_gather(ends.bool(), False)
            entropy = inputs.all_gather(entropy.detach(), 0.0)
        n_valid = mask.sum(1)
        candidate = mask & (_positions(mask) >= 1)
        forced = torch.zeros_like(n_valid, dtype=torch.bool)
        if self.eos_own_macro:
            forced = ends.bool().to(mask.device) & (n_valid >= 2)
            candidate = candidate & ~(_last_valid(mask) & forced[:, None])
        wanted = round(float(n_valid.sum()) / self.target)
        k = wanted - int((n_valid > 0).sum()) - int(forced.sum())
        values = entropy.detach()[candidate].to(torch.float64)
        if k <= 0:
            return math.inf
        if k >= values.numel():
            return -math.inf
        return float(torch.topk(values, k + 1).values[-1])

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        assert inputs.ref_entropy is not None
        tau = self.threshold_for(inputs)
        starts = (
            inputs.ref_entropy.detach().to(torch.float64) > tau
        )  # (B, A) token j starts a macro
        macro_end = torch.zeros_like(mask)
        macro_end[:, :-1] = starts[:, 1:]
        return TerminationOutput(
            macro_end=(macro_end | _last_valid(mask)) & mask,
            stats={"macro/entropy_threshold": tau},
        )


@register_rule("lowprob")
class LowProbRule(Rule):
    """Low-probability cut points (SPO's cutpoints, arXiv 2505.23564; SAE's segment boundaries,
    arXiv 2601.07320): token t is a cut point when its sampled probability under the rollout policy,
    p_t = π_old(a_t | s_t) (``inputs.old_logprobs``, at the sampling temperature), is below
    ``--lowprob_threshold``.

    ``--lowprob_cut after`` (default): a cut point is the last token of its macro action. Whether a
    macro action starts at token t then depends on tokens before t only, so the start states are
    stopping times and an advantage whose baseline is the value there stays unbiased with exact
    values. ``before``: a cut point opens the next macro action (as ``entropy`` does); the start of
    token t's macro action then depends on t's own sampled probability, an action-dependent baseline
    (benchmarks/credit_bias.py measures the bias).

    With ``--target_macro_len L*`` the threshold is chosen per batch, over every data-parallel
    rank's rows with ``inputs.all_gather``: with N valid tokens, R non-empty rows and F ends forced by
    ``--eos_own_macro``, the K = round(N / L*) - R - F candidates with the lowest probability become
    cut points (the last valid token always ends a macro action and is no candidate; nor is the
    forced end before an EOS), so the pooled mean length is about L* (exact without ties). The
    threshold used is logged as ``macro/lowprob_threshold`` (a probability; 0 when no cut is wanted,
    1 when every candidate is one).
    """

    needs: frozenset[str] = frozenset({"old_logprobs"})
    description = (
        "low sampled probability under the rollout policy (SPO's cutpoints, SAE's boundaries)"
    )
    flags = ("lowprob_threshold", "target_macro_len", "lowprob_cut", "eos_own_macro")

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

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.threshold = cfg.lowprob_threshold
        self.target = cfg.target_macro_len
        self.cut = cfg.lowprob_cut
        self.eos_own_macro = cfg.eos_own_macro

    def end_scores(self, surprisal: torch.Tensor) -> torch.Tensor:
        """(B, A) float64: the surprisal -log p of the cut point that would end a macro action at
        each token: its own (``after``) or its successor's (``before``; -inf at the last column)."""
        s = surprisal.to(torch.float64)
        if self.cut == "after":
            return s
        return torch.nn.functional.pad(s[:, 1:], (0, 1), value=-math.inf)

    def candidates(self, mask: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, int]:
        """((B, A) bool, F): the tokens whose end the rule decides (valid, not the last valid
        token, not the end forced before a final EOS) and the number F of forced ends."""
        n_valid = mask.sum(1)
        candidate = mask & ~_last_valid(mask)
        forced = torch.zeros_like(n_valid, dtype=torch.bool)
        if self.eos_own_macro:
            forced = ends.bool().to(mask.device) & (n_valid >= 2)
            before_last = _positions(mask) == (n_valid - 2)[:, None]
            candidate = candidate & ~(before_last & forced[:, None])
        return candidate, int(forced.sum())

    def surprisal_threshold(self, inputs: TerminationInputs) -> float:
        """tau on -log p: token ends are where the end score exceeds it (over all ranks' rows
        with ``inputs.all_gather``)."""
        if self.target is None:
            return -math.log(self.threshold)
        mask, ends, logp = inputs.action_mask, inputs.ends_with_eos, inputs.old_logprobs
        assert logp is not None
        if inputs.all_gather is not None:
            # tau depends on the multiset of (row length, EOS, candidate scores) only
            mask = inputs.all_gather(mask, False)
            ends = inputs.all_gather(ends.bool(), False)
            logp = inputs.all_gather(logp.detach(), 0.0)
        candidate, n_forced = self.candidates(mask, ends)
        n_valid = mask.sum(1)
        wanted = round(float(n_valid.sum()) / self.target)
        k = wanted - int((n_valid > 0).sum()) - n_forced
        values = self.end_scores(-logp.detach())[candidate]
        if k <= 0:
            return math.inf
        if k >= values.numel():
            return -math.inf
        return float(torch.topk(values, k + 1).values[-1])

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        assert inputs.old_logprobs is not None
        tau = self.surprisal_threshold(inputs)
        candidate, _ = self.candidates(mask, inputs.ends_with_eos)
        macro_end = candidate & (self.end_scores(-inputs.old_logprobs.detach()) > tau)
        return TerminationOutput(
            macro_end=(macro_end | _last_valid(mask)) & mask,
            stats={"macro/lowprob_threshold": math.exp(-tau)},
        )
