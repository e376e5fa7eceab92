"""Termination rules at work: what a rule reads (`TerminationInputs`, built for it by
:func:`termination_inputs`) and answers (`TerminationOutput`), how it is built and checked
(:func:`build_termination`), and the built-in rules that answer batches (MA-RLHF Sec. 3.1).

Every rule maps a right-padded batch of responses to `macro_end: (B, A) bool`, true on the last token of
each macro action and always on the last valid token. Rules are looked up by their CLI name in the
registry (``--termination_condition``, :mod:`marlhf.macro.rules`, which declares each built-in rule's
description, flags and label without torch); each class here implements one of them, a subclass of
its declaration registered under the same name. `build_termination` wraps the chosen rule with
input checks and the ``--eos_own_macro`` convention. The ``parsing`` rule is implemented in
:mod:`marlhf.macro.parsing.rule`, imported with its parser backends when it is first built.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from marlhf.macro.rules import (
    INPUT_SOURCES,
    RULES,
    Entropy,
    Fixed,
    LowProb,
    MacroFlags,
    Ppl,
    Randomized,
    Rule,
    Turn,
    register_rule,
    rule_class,
    rule_implementation,
    rules_help,
)

__all__ = [
    "RULES",
    "EntropyRule",
    "FixedRule",
    "LowProbRule",
    "PplRule",
    "RandomizedRule",
    "Rule",
    "TerminationInputs",
    "TerminationOutput",
    "TerminationRule",
    "TurnRule",
    "build_termination",
    "register_rule",
    "rule_class",
    "rules_help",
    "termination_inputs",
]


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
        turn_end: (B, A) bool | None — a multi-turn rollout's actions (``--env``: the tokens of
            each row's turns, compacted): true on each turn's last token. Every rule's macro
            actions end there too (a macro action never spans an observation); ``turn`` ends
            them there only.
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
    turn_end: torch.Tensor | None = None


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
    turn_end: torch.Tensor | None = None,
) -> TerminationInputs:
    """The `TerminationInputs` of a batch for ``rule`` (as built by :func:`build_termination`):
    the three fields every rule reads, of the optional per-token quantities those ``rule.needs``
    (each given as a (B, A) tensor or as a zero-argument callable computing it, called only when the
    rule reads it; the others are left None), the turn ends of a multi-turn rollout (every rule's
    macro actions end there) and the batch helpers as given.

    Raises:
        ValueError: a quantity the rule needs is not given (naming where it comes from).
    """
    needs = frozenset(getattr(rule, "needs", frozenset()))
    if "turn_end" in needs and turn_end is None:
        raise _missing(getattr(rule, "name", type(rule).__name__), "turn_end")
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
        turn_end=turn_end,
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


def _pooled(
    inputs: TerminationInputs, scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(action_mask, ends_with_eos, scores)`` of the rows a batch-chosen threshold is computed
    over: this rank's, or every rank's with ``inputs.all_gather``. Such a threshold depends only
    on the multiset of (row length, EOS, candidate scores), not on the rows' order, so the
    rank-major gathered rows give the threshold one process would."""
    mask, ends, scores = inputs.action_mask, inputs.ends_with_eos.bool(), scores.detach()
    if inputs.all_gather is None:
        return mask, ends, scores
    return (
        inputs.all_gather(mask, False),
        inputs.all_gather(ends, False),
        inputs.all_gather(scores, 0.0),
    )


def _threshold_above(values: torch.Tensor, k: int) -> float:
    """The threshold that exactly ``k`` of ``values: (N,)`` exceed (without ties): ``inf`` for
    ``k <= 0``, ``-inf`` when ``k`` is all of them, else the (k+1)-th largest value.

    >>> _threshold_above(torch.tensor([3.0, 1.0, 2.0]), 2), _threshold_above(torch.tensor([1.0]), 0)
    (1.0, inf)
    """
    if k <= 0:
        return math.inf
    if k >= values.numel():
        return -math.inf
    return float(torch.topk(values, k + 1).values[-1])


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
        turn_end = inputs.turn_end
        if turn_end is not None and (turn_end.dtype != torch.bool or turn_end.shape != (B, A)):
            raise ValueError(
                f"turn_end must be a (B, A) = {(B, A)} bool tensor, got {turn_end.dtype} "
                f"{tuple(turn_end.shape)}"
            )
        for name in sorted(self.needs):
            value = getattr(inputs, name, None)
            if value is None:
                raise _missing(self.name, name)
            if isinstance(value, torch.Tensor) and tuple(value.shape) != (B, A):
                raise ValueError(
                    f"TerminationInputs.{name} {tuple(value.shape)} must match action_mask {(B, A)}"
                )

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        """The rule's macro actions, ended on each row's last valid token and on every turn end
        (``inputs.turn_end``), and, with ``--eos_own_macro``, before a final EOS."""
        self._check(inputs)
        out = self.rule(inputs)
        mask = inputs.action_mask
        last = _last_valid(mask) & mask
        macro_end = (out.macro_end.bool() | last) & mask
        if inputs.turn_end is not None:  # a macro action never spans an observation
            macro_end = macro_end | (inputs.turn_end.to(mask.device) & mask)
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
    cls = rule_implementation(name)
    if cls.needs_tokenizer and tokenizer is None:
        raise ValueError(f"--termination_condition {name} needs the policy tokenizer")
    return _CheckedRule(name, cls(cfg, tokenizer), cfg.eos_own_macro)


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
# the built-in rules: each implements its declaration in marlhf.macro.rules (the description, flags,
# labels and inputs there) and registers itself in its place


@register_rule("fixed")
class FixedRule(Fixed):
    """Fixed n-gram: a macro action ends after every `--ngram` valid tokens and at the last one.

    ``n = 1`` makes every token its own macro action, so MA-PPO is exactly token-level PPO (the original
    added a spurious zero-length step when (T-1) % n == 0; this does not).
    """

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.n = cfg.ngram

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        macro_end = ((_positions(mask) + 1) % self.n == 0) | _last_valid(mask)
        return TerminationOutput(macro_end=macro_end & mask)


@register_rule("randomized")
class RandomizedRule(Randomized):
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


@register_rule("ppl")
class PplRule(Ppl):
    """Perplexity rule over the reference model's token NLLs, nll_t = -log p_ref(a_t | s_t).

    Scanning left to right, the current macro action holds tokens with running mean NLL m (its
    perplexity is exp(m)). Token t (t >= 1) starts a new macro action — i.e. token t-1 ends one — when

        (nll_t > m  and  current length >= --ppl_min_len)  or  (--ppl_max_len > 0 and
        current length >= --ppl_max_len),

    i.e. when adding t would raise the macro action's perplexity. The last valid token always ends a
    macro action. (The original intended ppl_{t+1} > ppl_t between neighbours, but its code could never
    fire.) Loops over A with batched tensor ops, never over rows.
    """

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
class EntropyRule(Entropy):
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

    def __init__(self, cfg: MacroFlags, tokenizer: Any = None) -> None:
        self.threshold = cfg.entropy_threshold
        self.target = cfg.target_macro_len
        self.eos_own_macro = cfg.eos_own_macro

    def threshold_for(self, inputs: TerminationInputs) -> float:
        """tau used for this batch (the fixed threshold, or the one meeting --target_macro_len), over
        all ranks' rows when ``inputs.all_gather`` is given."""
        if self.target is None:
            return self.threshold
        assert inputs.ref_entropy is not None
        mask, ends, entropy = _pooled(inputs, inputs.ref_entropy)
        n_valid = mask.sum(1)
        candidate = mask & (_positions(mask) >= 1)
        forced = torch.zeros_like(n_valid, dtype=torch.bool)
        if self.eos_own_macro:
            forced = ends.bool().to(mask.device) & (n_valid >= 2)
            candidate = candidate & ~(_last_valid(mask) & forced[:, None])
        wanted = round(float(n_valid.sum()) / self.target)
        k = wanted - int((n_valid > 0).sum()) - int(forced.sum())
        return _threshold_above(entropy[candidate].to(torch.float64), k)

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
class LowProbRule(LowProb):
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
        assert inputs.old_logprobs is not None
        mask, ends, logp = _pooled(inputs, inputs.old_logprobs)
        candidate, n_forced = self.candidates(mask, ends)
        n_valid = mask.sum(1)
        wanted = round(float(n_valid.sum()) / self.target)
        k = wanted - int((n_valid > 0).sum()) - n_forced
        return _threshold_above(self.end_scores(-logp)[candidate], k)

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


@register_rule("turn")
class TurnRule(Turn):
    """Each policy turn of a multi-turn rollout is one macro action: ``macro_end`` is
    ``inputs.turn_end`` (each turn's last action token) and the last valid token."""

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        assert inputs.turn_end is not None
        return TerminationOutput(
            macro_end=(inputs.turn_end.to(mask.device) | _last_valid(mask)) & mask
        )
