"""marlhf.macro.termination (and MacroConfig) against per-row Python loop references."""

import dataclasses
import doctest
import math

import pytest
import torch

import marlhf.macro.termination as termination_module
from marlhf.macro.config import MacroConfig
from marlhf.macro.termination import (
    RULES,
    TerminationInputs,
    TerminationOutput,
    build_termination,
    register_rule,
)
from marlhf.runtime.rows import derive_row_seeds


def random_inputs(seed: int, B: int = 9, A: int = 40, with_generator: bool = False):
    """Right-padded batch with lengths including 0, 1, 2 and A; mixed EOS/truncated rows;
    NaN on padding in the reference-model tensors (must never matter)."""
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(0, A + 1, (B,), generator=g)
    n_valid[:4] = torch.tensor([A, 0, 1, 2])
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    logp = -torch.rand(B, A, generator=g, dtype=torch.float64) * 4
    entropy = torch.rand(B, A, generator=g, dtype=torch.float64) * 4
    logp[~mask] = float("nan")
    entropy[~mask] = float("nan")
    return TerminationInputs(
        response_ids=torch.randint(0, 50, (B, A), generator=g),
        action_mask=mask,
        ends_with_eos=torch.rand(B, generator=g) < 0.6,
        ref_logprobs=logp,
        ref_entropy=entropy,
        generator=torch.Generator().manual_seed(seed + 1000) if with_generator else None,
    )


def row_len(inputs, b):
    return int(inputs.action_mask[b].sum())


def finish(ends: set[int], L: int, eos: bool, eos_own_macro: bool, A: int) -> list[bool]:
    """Add the last-token end and the EOS split; return the row as a list of bools."""
    if L > 0:
        ends.add(L - 1)
    if eos_own_macro and eos and L >= 2:
        ends.add(L - 2)
    return [t in ends and t < L for t in range(A)]


def check(rule_out, inputs, ref_row):
    B, A = inputs.action_mask.shape
    for b in range(B):
        assert rule_out.macro_end[b].tolist() == ref_row(b), f"row {b}"
    assert not (rule_out.macro_end & ~inputs.action_mask).any()
    assert rule_out.fallback.shape == (B,) and not rule_out.fallback.any()


# ------------------------------------------------------------------ fixed


def fixed_ref(inputs, b, n, eos_own_macro):
    L = row_len(inputs, b)
    ends = {t for t in range(L) if (t + 1) % n == 0}
    return finish(
        ends, L, bool(inputs.ends_with_eos[b]), eos_own_macro, inputs.action_mask.shape[1]
    )


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("n", [1, 2, 3, 5, 40, 100])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_fixed_matches_loop(seed, n, eos_own_macro):
    inputs = random_inputs(seed)
    rule = build_termination(
        MacroConfig(termination_condition="fixed", ngram=n, eos_own_macro=eos_own_macro)
    )
    check(rule(inputs), inputs, lambda b: fixed_ref(inputs, b, n, eos_own_macro))


def test_fixed_one_is_every_token_and_long_n_is_one_macro():
    inputs = random_inputs(3)
    mask = inputs.action_mask
    out = build_termination(MacroConfig(ngram=1))(inputs)
    assert torch.equal(out.macro_end, mask)
    out = build_termination(MacroConfig(ngram=1000))(inputs)
    n_valid = mask.sum(1)
    expected_count = (n_valid > 0).long() + (inputs.ends_with_eos & (n_valid >= 2)).long()
    assert torch.equal(out.macro_end.sum(1), expected_count)
    out = build_termination(MacroConfig(ngram=1000, eos_own_macro=False))(inputs)
    assert torch.equal(out.macro_end.sum(1), (n_valid > 0).long())


# ------------------------------------------------------------------ randomized


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randomized_ref(inputs, b, lengths, eos_own_macro):
    L = row_len(inputs, b)
    ends, pos = set(), 0
    for n in lengths:
        pos += n
        if pos - 1 >= L:
            break
        ends.add(pos - 1)
    return finish(
        ends, L, bool(inputs.ends_with_eos[b]), eos_own_macro, inputs.action_mask.shape[1]
    )


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("repeat_times", [1, 2])
def test_randomized_original_matches_loop(seed, repeat_times):
    inputs = random_inputs(seed, with_generator=True)
    cfg = MacroConfig(termination_condition="randomized", repeat_times=repeat_times)
    out = build_termination(cfg)(inputs)
    # Reproduce the documented draw: row seeds from the generator, then one permutation of
    # choices * repeat_times per row from the row's own generator.
    pool = list(cfg.ngram_choices) * repeat_times
    seeds = torch.randint(2**32, (inputs.action_mask.shape[0],), generator=_gen(seed + 1000))
    perm = [torch.rand(len(pool), generator=_gen(int(s))).argsort() for s in seeds]
    check(out, inputs, lambda b: randomized_ref(inputs, b, [pool[i] for i in perm[b]], True))


@pytest.mark.parametrize("seed", range(3))
def test_randomized_resample_matches_loop(seed):
    inputs = random_inputs(seed, with_generator=True)
    cfg = MacroConfig(
        termination_condition="randomized", randomized_mode="resample", ngram_choices=(2, 3, 7)
    )
    out = build_termination(cfg)(inputs)
    seeds = torch.randint(2**32, (inputs.action_mask.shape[0],), generator=_gen(seed + 1000))
    draws = [
        torch.randint(3, (row_len(inputs, b),), generator=_gen(int(s))) for b, s in enumerate(seeds)
    ]
    check(out, inputs, lambda b: randomized_ref(inputs, b, [(2, 3, 7)[i] for i in draws[b]], True))


def test_randomized_original_uses_each_length_once_then_one_macro():
    # Independent invariant: on responses longer than sum(choices) = 21, without the EOS split,
    # the first 5 macro lengths are a permutation of (1, 2, 3, 5, 10) and the rest is one macro action.
    B, A = 16, 30
    inputs = TerminationInputs(
        response_ids=torch.zeros(B, A, dtype=torch.long),
        action_mask=torch.ones(B, A, dtype=torch.bool),
        ends_with_eos=torch.ones(B, dtype=torch.bool),
        generator=torch.Generator().manual_seed(7),
    )
    out = build_termination(MacroConfig(termination_condition="randomized", eos_own_macro=False))(
        inputs
    )
    orders = set()
    for b in range(B):
        ends = [t for t in range(A) if out.macro_end[b, t]]
        lengths = [e - s for s, e in zip([-1] + ends[:-1], ends, strict=True)]
        assert sorted(lengths[:5]) == [1, 2, 3, 5, 10]
        assert lengths[5:] == [A - 21]
        orders.add(tuple(lengths[:5]))
    assert len(orders) > 1  # each row has its own draw


def test_randomized_reproducible_from_seeded_generator():
    cfg = MacroConfig(termination_condition="randomized")
    rule = build_termination(cfg)
    a = rule(random_inputs(0, with_generator=True)).macro_end
    b = rule(random_inputs(0, with_generator=True)).macro_end
    inputs = random_inputs(0, with_generator=True)
    inputs.generator = torch.Generator().manual_seed(12345)
    c = rule(inputs).macro_end
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def _rows(inputs: TerminationInputs, idx: list[int], width: int) -> TerminationInputs:
    """Rows `idx` of a batch as their own batch, cut or right-padded to `width` columns."""

    def cut(x, pad):
        x = x[idx]
        if x.dim() == 1:
            return x
        x = x[:, :width]
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad)

    return TerminationInputs(
        response_ids=cut(inputs.response_ids, 0),
        action_mask=cut(inputs.action_mask, False),
        ends_with_eos=cut(inputs.ends_with_eos, False),
        ref_logprobs=cut(inputs.ref_logprobs, float("nan")),
        ref_entropy=cut(inputs.ref_entropy, float("nan")),
        row_seeds=None if inputs.row_seeds is None else inputs.row_seeds[idx],
    )


@pytest.mark.parametrize("mode", ["original", "resample"])
def test_randomized_row_depends_only_on_its_seed(mode):
    """Split-independence: a row's macro actions are the same in any batch (other rows, order,
    width), given its seed, so data-parallel ranks segment like one process."""
    inputs = random_inputs(4, with_generator=True)
    B, A = inputs.action_mask.shape
    inputs.row_seeds = derive_row_seeds(1234, 3, torch.arange(B))
    rule = build_termination(
        MacroConfig(termination_condition="randomized", randomized_mode=mode, repeat_times=2)
    )
    whole = rule(inputs).macro_end
    inputs.generator = torch.Generator().manual_seed(99)  # unused with row seeds
    assert torch.equal(rule(inputs).macro_end, whole)
    for idx in ([5, 0, 8], [7, 6, 4, 3, 2, 1]):
        for width in (int(inputs.action_mask[idx].sum(1).max().clamp(min=1)), A + 7):
            part = rule(_rows(inputs, idx, width)).macro_end
            assert torch.equal(part[:, :A], whole[idx, :width]), (idx, width)
            assert not part[:, A:].any()
    # another step's seeds give other segments
    inputs.row_seeds = derive_row_seeds(1234, 4, torch.arange(B))
    assert not torch.equal(rule(inputs).macro_end, whole)


# ------------------------------------------------------------------ ppl


def ppl_ref(inputs, b, min_len, max_len, eos_own_macro):
    L = row_len(inputs, b)
    nll = [-inputs.ref_logprobs[b, t].item() for t in range(L)]
    ends, current = set(), []
    for t in range(L):
        if current:
            mean = sum(current) / len(current)
            cut = (nll[t] > mean and len(current) >= min_len) or (0 < max_len <= len(current))
            if cut:
                ends.add(t - 1)
                current = []
        current.append(nll[t])
    return finish(
        ends, L, bool(inputs.ends_with_eos[b]), eos_own_macro, inputs.action_mask.shape[1]
    )


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("min_len,max_len", [(1, 0), (2, 0), (3, 4), (1, 1)])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_ppl_matches_loop(seed, min_len, max_len, eos_own_macro):
    inputs = random_inputs(seed)
    cfg = MacroConfig(
        termination_condition="ppl",
        ppl_min_len=min_len,
        ppl_max_len=max_len,
        eos_own_macro=eos_own_macro,
    )
    out = build_termination(cfg)(inputs)
    check(out, inputs, lambda b: ppl_ref(inputs, b, min_len, max_len, eos_own_macro))


def test_ppl_hand_example():
    # NLL = (1, 3, 2, 0.5, 4). Macro {1}: 3 > 1 -> cut before 1. Macro {3}: 2 <= 3 join -> mean 2.5;
    # 0.5 <= 2.5 join -> mean 11/6; 4 > 11/6 -> cut before 4. Ends: 0, 3, 4.
    logp = -torch.tensor([[1.0, 3.0, 2.0, 0.5, 4.0]])
    inputs = TerminationInputs(
        response_ids=torch.zeros(1, 5, dtype=torch.long),
        action_mask=torch.ones(1, 5, dtype=torch.bool),
        ends_with_eos=torch.tensor([False]),
        ref_logprobs=logp,
    )
    out = build_termination(MacroConfig(termination_condition="ppl"))(inputs)
    assert out.macro_end.int().tolist() == [[1, 0, 0, 1, 1]]


def test_missing_needs_is_a_clear_error():
    inputs = random_inputs(0)
    inputs.ref_logprobs = None
    with pytest.raises(ValueError, match="ppl.*ref_logprobs"):
        build_termination(MacroConfig(termination_condition="ppl"))(inputs)
    inputs = random_inputs(0)
    inputs.ref_entropy = None
    with pytest.raises(ValueError, match="ref_entropy"):
        build_termination(MacroConfig(termination_condition="entropy"))(inputs)
    inputs = random_inputs(0)
    inputs.ref_entropy = inputs.ref_entropy[:, :-1]
    with pytest.raises(ValueError, match="ref_entropy"):
        build_termination(MacroConfig(termination_condition="entropy"))(inputs)


# ------------------------------------------------------------------ entropy


def entropy_ref(inputs, b, tau, eos_own_macro):
    L = row_len(inputs, b)
    ends = {j - 1 for j in range(1, L) if inputs.ref_entropy[b, j].item() > tau}
    return finish(
        ends, L, bool(inputs.ends_with_eos[b]), eos_own_macro, inputs.action_mask.shape[1]
    )


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("tau", [0.5, 2.0, 3.5])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_entropy_matches_loop(seed, tau, eos_own_macro):
    inputs = random_inputs(seed)
    cfg = MacroConfig(
        termination_condition="entropy", entropy_threshold=tau, eos_own_macro=eos_own_macro
    )
    out = build_termination(cfg)(inputs)
    check(out, inputs, lambda b: entropy_ref(inputs, b, tau, eos_own_macro))


def test_entropy_threshold_zero_is_token_level_and_inf_one_macro():
    inputs = random_inputs(1)
    inputs.ref_entropy = torch.where(inputs.action_mask, inputs.ref_entropy + 1e-3, 0.0)
    mask = inputs.action_mask
    zero = MacroConfig(termination_condition="entropy", entropy_threshold=0.0)
    assert torch.equal(build_termination(zero)(inputs).macro_end, mask)
    inf = MacroConfig(
        termination_condition="entropy", entropy_threshold=math.inf, eos_own_macro=False
    )
    n_valid = mask.sum(1)
    assert torch.equal(build_termination(inf)(inputs).macro_end.sum(1), (n_valid > 0).long())


@pytest.mark.parametrize("target", [1.0, 2.5, 4.0, 9.0])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_entropy_target_macro_len_hits_target(target, eos_own_macro):
    g = torch.Generator().manual_seed(int(target * 10))
    B, A = 32, 200
    n_valid = torch.randint(20, A + 1, (B,), generator=g)
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    inputs = TerminationInputs(
        response_ids=torch.zeros(B, A, dtype=torch.long),
        action_mask=mask,
        ends_with_eos=torch.rand(B, generator=g) < 0.5,
        ref_entropy=torch.rand(B, A, generator=g) * 5,
    )
    cfg = MacroConfig(
        termination_condition="entropy", target_macro_len=target, eos_own_macro=eos_own_macro
    )
    out = build_termination(cfg)(inputs)
    mean_len = mask.sum().item() / out.macro_end.sum().item()
    assert mean_len == pytest.approx(target, rel=0.01)
    # The chosen threshold applied as a fixed one gives the same segmentation (loop reference).
    tau = RULES["entropy"](cfg, None).threshold_for(inputs)
    check(out, inputs, lambda b: entropy_ref(inputs, b, tau, eos_own_macro))


def _fake_all_gather(parts: list[TerminationInputs], r: int):
    """Rank r's `all_gather` over the simulated ranks' batches `parts`: the same field of every part,
    in rank order, widths right-padded (what `marlhf.runtime.distributed.all_gather_padded` returns)."""

    def gather(x, pad):
        name = (
            "ends_with_eos"
            if x.dim() == 1
            else ("action_mask" if x.dtype == torch.bool else "ref_entropy")
        )
        assert torch.equal(x.nan_to_num(0.0), getattr(parts[r], name).nan_to_num(0.0)), name
        fields = [getattr(p, name) for p in parts]
        if x.dim() == 1:
            return torch.cat(fields)
        width = max(f.shape[1] for f in fields)
        return torch.cat(
            [torch.nn.functional.pad(f, (0, width - f.shape[1]), value=pad) for f in fields]
        )

    return gather


@pytest.mark.parametrize("target", [1.5, 3.0, 6.0])
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_entropy_target_tau_is_global_over_ranks(target, eos_own_macro):
    """Three simulated ranks, each its own width: with `all_gather` every rank chooses the tau of
    the concatenated batch and segments its rows as the whole batch's rule does."""
    inputs = random_inputs(5, B=12, A=30)
    cfg = MacroConfig(
        termination_condition="entropy", target_macro_len=target, eos_own_macro=eos_own_macro
    )
    rule, chooser = build_termination(cfg), RULES["entropy"](cfg, None)
    whole = rule(inputs)
    tau = chooser.threshold_for(inputs)
    splits = ([3, 0, 7, 11], [1, 2, 9, 10], [4, 5, 6, 8])
    parts = [
        _rows(inputs, idx, int(inputs.action_mask[idx].sum(1).max().clamp(min=1))) for idx in splits
    ]
    local_taus = {chooser.threshold_for(p) for p in parts}
    assert local_taus != {tau}  # per-rank choices would differ: the test can tell
    for r, (idx, part) in enumerate(zip(splits, parts, strict=True)):
        part.all_gather = _fake_all_gather(parts, r)
        assert chooser.threshold_for(part) == tau
        out = rule(part)
        assert out.stats == {"macro/entropy_threshold": tau}
        width = part.action_mask.shape[1]
        assert torch.equal(out.macro_end, whole.macro_end[idx, :width])
        assert not whole.macro_end[idx, width:].any()


# ------------------------------------------------------------------ registry and config


def test_registry():
    assert {"fixed", "randomized", "ppl", "entropy"} <= set(RULES)

    class Everything:
        needs = frozenset()

        def __init__(self, cfg, tokenizer=None):
            pass

        def __call__(self, inputs):
            return TerminationOutput(macro_end=inputs.action_mask.clone())

    saved = dict(RULES)  # restored whole afterwards: its order is the order --help lists them in
    try:
        assert register_rule("fixed")(Everything) is Everything
        inputs = random_inputs(0)
        out = build_termination(MacroConfig(ngram=7))(inputs)
        assert torch.equal(out.macro_end, inputs.action_mask)
        del RULES["fixed"]
        with pytest.raises(ValueError, match="known: .*entropy"):
            build_termination(MacroConfig())
    finally:
        RULES.clear()
        RULES.update(saved)


def test_wrapper_validates_inputs():
    inputs = random_inputs(0)
    rule = build_termination(MacroConfig())
    bad = dataclasses.replace(inputs, action_mask=inputs.action_mask.long())
    with pytest.raises(ValueError, match="bool"):
        rule(bad)
    holes = inputs.action_mask.clone()
    holes[0, 3] = False
    with pytest.raises(ValueError, match="right-padded"):
        rule(dataclasses.replace(inputs, action_mask=holes))
    with pytest.raises(ValueError, match="ends_with_eos"):
        rule(dataclasses.replace(inputs, ends_with_eos=inputs.ends_with_eos[:-1]))
    with pytest.raises(ValueError, match="row_seeds"):
        rule(dataclasses.replace(inputs, row_seeds=torch.zeros(3, dtype=torch.long)))


@pytest.mark.parametrize(
    "kwargs,flag",
    [
        ({"termination_condition": "sentence"}, "--termination_condition"),
        ({"ngram": 0}, "--ngram"),
        ({"ngram_choices": ()}, "--ngram_choices"),
        ({"ngram_choices": (2, 0)}, "--ngram_choices"),
        ({"repeat_times": 0}, "--repeat_times"),
        ({"randomized_mode": "x"}, "--randomized_mode"),
        ({"parsing_cutoff": 0}, "--parsing_cutoff"),
        ({"parser_backend": "stanza"}, "--parser_backend"),
        ({"parse_workers": -1}, "--parse_workers"),
        ({"ppl_min_len": 0}, "--ppl_min_len"),
        ({"ppl_max_len": -1}, "--ppl_max_len"),
        ({"ppl_min_len": 3, "ppl_max_len": 2}, "--ppl_max_len"),
        ({"entropy_threshold": -1.0}, "--entropy_threshold"),
        ({"entropy_threshold": math.nan}, "--entropy_threshold"),
        ({"target_macro_len": 0.5}, "--target_macro_len"),
        ({"value_function": "mean"}, "--value_function"),
        ({"macro_reward_agg": "mean"}, "--macro_reward_agg"),
        ({"value_function": "start", "macro_reward_agg": "weighted"}, "--macro_reward_agg sum"),
    ],
)
def test_config_validation_names_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        MacroConfig(**kwargs)


def test_config_defaults_and_metadata():
    cfg = MacroConfig()
    assert cfg.termination_condition == "fixed" and cfg.ngram == 1
    assert cfg.ngram_choices == (1, 2, 3, 5, 10) and cfg.value_function == "equal"
    assert cfg.macro_reward_agg == "sum" and cfg.eos_own_macro
    meta = {f.name: f.metadata for f in dataclasses.fields(MacroConfig)}
    assert all(m.get("help") for m in meta.values())
    assert "--parser_cutoff" in meta["parsing_cutoff"]["aliases"]
    MacroConfig(entropy_threshold=math.inf, target_macro_len=3.0)  # valid
    MacroConfig(value_function="start")  # valid


def test_doctests():
    assert doctest.testmod(termination_module).failed == 0


# ------------------------------------------------------------------ turn ends (multi-turn rollouts)


def with_turns(inputs: TerminationInputs, seed: int) -> TerminationInputs:
    """``inputs`` with random turn ends inside each row (a multi-turn rollout's compacted actions),
    always on its last valid token."""
    g = torch.Generator().manual_seed(seed + 77)
    mask = inputs.action_mask
    ends = (torch.rand(mask.shape, generator=g) < 0.15) & mask
    last = mask & ~torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    return dataclasses.replace(inputs, turn_end=ends | last)


def turns_of(inputs, b) -> set[int]:
    return {t for t in range(row_len(inputs, b)) if bool(inputs.turn_end[b, t])}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("eos_own_macro", [True, False])
def test_turn_rule_ends_macro_actions_at_the_turn_ends_only(seed, eos_own_macro):
    inputs = with_turns(random_inputs(seed), seed)
    cfg = MacroConfig(termination_condition="turn", eos_own_macro=eos_own_macro)
    out = build_termination(cfg)(inputs)
    A = inputs.action_mask.shape[1]
    check(
        out, inputs,
        lambda b: finish(
            turns_of(inputs, b), row_len(inputs, b), bool(inputs.ends_with_eos[b]),
            eos_own_macro, A,
        ),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("n", [1, 3, 7])
def test_every_rule_also_ends_a_macro_action_at_each_turn_end(seed, n):
    """A macro action never spans an observation: fixed n-grams (and any other rule) end at each
    turn's last action token too."""
    inputs = with_turns(random_inputs(seed), seed)
    out = build_termination(MacroConfig(ngram=n, eos_own_macro=False))(inputs)
    A = inputs.action_mask.shape[1]
    check(
        out, inputs,
        lambda b: finish(
            turns_of(inputs, b) | {t for t in range(row_len(inputs, b)) if (t + 1) % n == 0},
            row_len(inputs, b), False, False, A,
        ),
    )  # fmt: skip


def test_the_turn_rule_needs_the_turn_ends():
    inputs = random_inputs(0)
    rule = build_termination(MacroConfig(termination_condition="turn"))
    with pytest.raises(ValueError, match="turn.*turn_end.*--env"):
        rule(inputs)
    with pytest.raises(ValueError, match="turn_end must be a"):
        rule(dataclasses.replace(inputs, turn_end=inputs.action_mask[:, :-1]))
