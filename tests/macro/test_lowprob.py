"""The ``lowprob`` termination rule against a per-row Python loop, its target mean length, and its
threshold chosen over all data-parallel ranks' rows."""

import math

import pytest
import torch

from marlhf.macro.config import MacroConfig
from marlhf.macro.termination import RULES, TerminationInputs, build_termination


def random_inputs(seed: int, B: int = 9, A: int = 30) -> TerminationInputs:
    """Right-padded rows of lengths 0, 1, 2, A and random ones, EOS or truncated, NaN log-probs on
    padding (must never matter)."""
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(0, A + 1, (B,), generator=g)
    n_valid[:4] = torch.tensor([A, 0, 1, 2])
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    logp = torch.log(torch.rand(B, A, generator=g, dtype=torch.float64).clamp(min=1e-6))
    logp[~mask] = float("nan")
    return TerminationInputs(
        response_ids=torch.zeros(B, A, dtype=torch.long),
        action_mask=mask,
        ends_with_eos=torch.rand(B, generator=g) < 0.6,
        old_logprobs=logp,
    )


def loop_ends(probs: list[float], eos: bool, rho: float, cut: str, eos_own_macro: bool) -> set[int]:
    """One row by hand: the tokens that end a macro action."""
    L = len(probs)
    if cut == "after":  # a cut point is the last token of its macro action
        ends = {t for t in range(L) if probs[t] < rho}
    else:  # a cut point opens the next macro action
        ends = {t - 1 for t in range(1, L) if probs[t] < rho}
    if L > 0:
        ends.add(L - 1)
    if eos_own_macro and eos and L >= 2:
        ends.add(L - 2)
    return ends


def row(inputs: TerminationInputs, b: int) -> tuple[list[float], bool]:
    n = int(inputs.action_mask[b].sum())
    return [math.exp(x) for x in inputs.old_logprobs[b, :n].tolist()], bool(inputs.ends_with_eos[b])


def check(out, inputs: TerminationInputs, rho: float, cut: str, eos_own_macro: bool) -> None:
    B, A = inputs.action_mask.shape
    for b in range(B):
        probs, eos = row(inputs, b)
        ends = loop_ends(probs, eos, rho, cut, eos_own_macro)
        assert out.macro_end[b].tolist() == [t in ends for t in range(A)], f"row {b}"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rho", [0.05, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("cut", ["after", "before"])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_lowprob_threshold_matches_loop(seed, rho, cut, eos_own_macro):
    inputs = random_inputs(seed)
    cfg = MacroConfig(
        termination_condition="lowprob",
        lowprob_threshold=rho,
        lowprob_cut=cut,
        eos_own_macro=eos_own_macro,
    )
    out = build_termination(cfg)(inputs)
    check(out, inputs, rho, cut, eos_own_macro)
    assert out.stats["macro/lowprob_threshold"] == pytest.approx(rho)


def loop_target_threshold(inputs, target: float, cut: str, eos_own_macro: bool) -> float:
    """The probability threshold of ``--target_macro_len`` by hand: the K candidates of lowest
    probability become cut points, K = round(N / target) - rows - forced ends."""
    candidates, n_tokens, rows, forced = [], 0, 0, 0
    for b in range(inputs.action_mask.shape[0]):
        probs, eos = row(inputs, b)
        L = len(probs)
        n_tokens += L
        rows += L > 0
        is_forced = eos_own_macro and eos and L >= 2
        forced += is_forced
        for t in range(L - 1):  # the last token always ends one: no candidate
            if is_forced and t == L - 2:
                continue
            candidates.append(probs[t] if cut == "after" else probs[t + 1])
    k = round(n_tokens / target) - rows - forced
    if k <= 0:
        return 0.0
    if k >= len(candidates):
        return 1.0
    return sorted(candidates)[k]  # the (K+1)-th lowest: cut where p is below it


@pytest.mark.parametrize("target", [1.5, 3.0, 7.0])
@pytest.mark.parametrize("cut", ["after", "before"])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_lowprob_target_macro_len_matches_loop_and_hits_target(target, cut, eos_own_macro):
    g = torch.Generator().manual_seed(int(target * 10))
    B, A = 24, 120
    n_valid = torch.randint(20, A + 1, (B,), generator=g)
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    inputs = TerminationInputs(
        response_ids=torch.zeros(B, A, dtype=torch.long),
        action_mask=mask,
        ends_with_eos=torch.rand(B, generator=g) < 0.5,
        old_logprobs=torch.log(torch.rand(B, A, generator=g, dtype=torch.float64)),
    )
    cfg = MacroConfig(
        termination_condition="lowprob",
        target_macro_len=target,
        lowprob_cut=cut,
        eos_own_macro=eos_own_macro,
    )
    out = build_termination(cfg)(inputs)
    rho = loop_target_threshold(inputs, target, cut, eos_own_macro)
    assert out.stats["macro/lowprob_threshold"] == pytest.approx(rho, rel=1e-12)
    check(out, inputs, rho, cut, eos_own_macro)
    assert mask.sum().item() / out.macro_end.sum().item() == pytest.approx(target, rel=0.01)


def _rows(inputs: TerminationInputs, idx: list[int]) -> TerminationInputs:
    width = int(inputs.action_mask[idx].sum(1).max().clamp(min=1))
    return TerminationInputs(
        response_ids=inputs.response_ids[idx, :width],
        action_mask=inputs.action_mask[idx, :width],
        ends_with_eos=inputs.ends_with_eos[idx],
        old_logprobs=inputs.old_logprobs[idx, :width],
    )


def _fake_all_gather(parts: list[TerminationInputs], r: int):
    """Rank r's `all_gather` over the simulated ranks' batches (rank order, widths right-padded:
    what `marlhf.runtime.distributed.all_gather_padded` returns)."""

    def gather(x, pad):
        if x.dim() == 1:
            name = "ends_with_eos"
        else:
            name = "action_mask" if x.dtype == torch.bool else "old_logprobs"
        assert torch.equal(x.nan_to_num(0.0), getattr(parts[r], name).nan_to_num(0.0)), name
        fields = [getattr(p, name) for p in parts]
        if x.dim() == 1:
            return torch.cat(fields)
        width = max(f.shape[1] for f in fields)
        return torch.cat(
            [torch.nn.functional.pad(f, (0, width - f.shape[1]), value=pad) for f in fields]
        )

    return gather


@pytest.mark.parametrize("cut", ["after", "before"])
def test_lowprob_target_threshold_is_global_over_ranks(cut):
    """Three simulated ranks, each its own width: with `all_gather` each rank uses the threshold of
    the whole batch and segments its rows as the whole batch's rule does."""
    inputs = random_inputs(5, B=12, A=30)
    cfg = MacroConfig(termination_condition="lowprob", target_macro_len=3.0, lowprob_cut=cut)
    rule, chooser = build_termination(cfg), RULES["lowprob"](cfg, None)
    whole = rule(inputs)
    tau = chooser.surprisal_threshold(inputs)
    splits = ([3, 0, 7, 11], [1, 2, 9, 10], [4, 5, 6, 8])
    parts = [_rows(inputs, idx) for idx in splits]
    assert {chooser.surprisal_threshold(p) for p in parts} != {tau}  # the test can tell
    for r, (idx, part) in enumerate(zip(splits, parts, strict=True)):
        part.all_gather = _fake_all_gather(parts, r)
        out = rule(part)
        assert out.stats["macro/lowprob_threshold"] == math.exp(-tau)
        width = part.action_mask.shape[1]
        assert torch.equal(out.macro_end, whole.macro_end[idx, :width])


def test_lowprob_needs_the_rollout_logprobs_and_validates_its_flags():
    inputs = random_inputs(0)
    inputs.old_logprobs = None
    with pytest.raises(ValueError, match="lowprob.*old_logprobs.*rollout"):
        build_termination(MacroConfig(termination_condition="lowprob"))(inputs)
    for kwargs, flag in (
        ({"lowprob_threshold": 0.0}, "--lowprob_threshold"),
        ({"lowprob_threshold": 1.5}, "--lowprob_threshold"),
        ({"lowprob_cut": "inside"}, "--lowprob_cut"),
        ({"macro_credit": "first"}, "--macro_credit"),
    ):
        with pytest.raises(ValueError, match=flag):
            MacroConfig(**kwargs)
