"""An enumerable toy for the bias of advantage estimators when the policy decides how many macro
actions a response has (verl RFC #7244: a baseline computed per macro-action index is then an
action-dependent baseline, a hidden bonus or penalty on taking another macro action).

The toy. Tokens ``a``, ``b`` and EOS; a response has at most ``L`` tokens (EOS ends it earlier;
without EOS it is cut at ``L``), so there are 2^(L+1) - 1 responses (31 for L = 4). The policy is a
tabular softmax, one logit vector per prefix (seeded random values), so every gradient is exact.
Rewards: a per-token reward (like the KL rewards: ``a`` -0.3, ``b`` -0.1, EOS 0; ``--no_kl``: none)
and a final score R = 2·[first token is a] + 0.8·#b - [cut at L]. The number of macro actions is
the policy's choice through EOS.

What is compared. The true gradient of J = E[sum_t r_t + R] (autograd through the enumerated
probabilities) against each estimator's expected update direction E[sum_t grad log π(a_t|s_t) Â_t],
also exact: the estimator runs on every response, or on every group of G responses (every G-tuple,
weighted by its probability), with exact values where it takes values (the critic's V(s_t) for
``gae``, V̂ at the Monte-Carlo boundaries for ``macro_mc``: its estimates are unbiased and enter
linearly). Reported: the cosine to ∇J, the best scale c (E[ĝ] ≈ c·∇J) and the relative residual
|E[ĝ] - c·∇J| / |E[ĝ]|: 0 for an estimator whose expected update points along the gradient.

The estimators: the per-index group baseline of RFC #7244 (per-macro-action rewards normalised by
the mean of the group's rewards at the same macro-action index, over the samples that have that
index, and summed over the response's own remaining macro actions; ``loo``: the other samples'
mean), this project's ``rloo``, ``dr_grpo``, ``grpo``, ``gae`` (exact V; value weightings ``start``
and ``equal``; λ 1 and 0.95), ``macro_mc`` (spaced and spread boundary selections) and the
``lowprob`` rule cutting after or before the low-probability token, and ``--macro_credit boundary``.

    .venv/bin/python benchmarks/credit_bias.py    # the table of docs/research/estimator-bias.md
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marlhf.algo.estimators import (  # noqa: E402
    EstimatorInputs,
    EstimatorOptions,
    MCValues,
    build_estimator,
    select_mc_boundaries,
    select_spaced_mc_boundaries,
)
from marlhf.macro import MacroConfig, TerminationInputs, build_segments, build_termination  # noqa: E402
from marlhf.macro.credit import credit_mask  # noqa: E402
from marlhf.macro.segments import MacroSegments, to_macro, to_tokens  # noqa: E402

A_TOK, B_TOK, EOS = 0, 1, 2
TOKEN_REWARD = (-0.3, -0.1, 0.0)  # a, b, EOS: the KL-like per-token rewards
DTYPE = torch.float64


@dataclass
class Toy:
    """Every response of the toy and the policy.

    Fields (N responses, L tokens at most, P prefixes without EOS):
        ids: (N, L) long — tokens, EOS-padded past each response.
        mask: (N, L) bool — the response's tokens.
        eos: (N,) bool — ends with EOS (else cut at L).
        state: (N, L) long — the prefix (state) each token is sampled in, 0 on padding.
        theta: (P, 3) float64 — the policy's logits per prefix (requires grad).
        kl: (N, L) float64 — per-token rewards (0 on padding).
        score: (N,) float64 — the final score R.
    """

    ids: torch.Tensor
    mask: torch.Tensor
    eos: torch.Tensor
    state: torch.Tensor
    theta: torch.Tensor
    kl: torch.Tensor
    score: torch.Tensor

    @property
    def n(self) -> int:
        return self.ids.shape[0]

    def logprobs(self) -> torch.Tensor:
        """(N, L) log π(a_t | s_t), 0 on padding (differentiable in theta)."""
        logp = torch.log_softmax(self.theta, -1)[self.state]  # (N, L, 3)
        lp = logp.gather(2, self.ids[..., None]).squeeze(2)
        return torch.where(self.mask, lp, 0.0)

    def probs(self) -> torch.Tensor:
        """(N,) the probability of each response (differentiable)."""
        return self.logprobs().sum(1).exp()

    def returns(self) -> torch.Tensor:
        """(N,) sum of the per-token rewards plus the score."""
        return self.kl.sum(1) + self.score

    def values(self) -> torch.Tensor:
        """(N, L) exact V(s_t): the expected rewards from token t on (its own included) plus the
        score, given the prefix before token t; 0 on padding."""
        p = self.probs().detach()
        future = self.kl.flip(1).cumsum(1).flip(1) + self.score[:, None]  # (N, L)
        P = self.theta.shape[0]
        w = torch.where(self.mask, p[:, None], 0.0)
        num = torch.zeros(P, dtype=DTYPE).index_add_(
            0, self.state[self.mask], (w * future)[self.mask]
        )
        den = torch.zeros(P, dtype=DTYPE).index_add_(0, self.state[self.mask], w[self.mask])
        return torch.where(self.mask, (num / den.clamp(min=1e-300))[self.state], 0.0)

    def score_values(self) -> torch.Tensor:
        """(N, L) exact E[R | s_t] (the score only: what ``macro_mc``'s continuations estimate)."""
        saved = self.kl
        self.kl = torch.zeros_like(saved)
        try:
            return self.values()
        finally:
            self.kl = saved


def make_toy(L: int = 4, seed: int = 0, kl: bool = True, scale: float = 0.8) -> Toy:
    """The toy with responses of at most ``L`` tokens and seeded random logits."""
    prefixes = [p for n in range(L) for p in itertools.product((A_TOK, B_TOK), repeat=n)]
    index = {p: i for i, p in enumerate(prefixes)}
    responses = [(*p, EOS) for p in prefixes] + list(itertools.product((A_TOK, B_TOK), repeat=L))
    N = len(responses)
    ids = torch.full((N, L), EOS, dtype=torch.long)
    mask = torch.zeros(N, L, dtype=torch.bool)
    state = torch.zeros(N, L, dtype=torch.long)
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
        for t in range(len(r)):
            state[i, t] = index[tuple(r[:t])]
    eos = torch.tensor([r[-1] == EOS for r in responses])
    g = torch.Generator().manual_seed(seed)
    theta = (torch.randn(len(prefixes), 3, generator=g, dtype=DTYPE) * scale).requires_grad_()
    per_token = torch.tensor(TOKEN_REWARD, dtype=DTYPE)[ids] * mask
    if not kl:
        per_token = torch.zeros_like(per_token)
    n_b = ((ids == B_TOK) & mask).sum(1).to(DTYPE)
    score = 2.0 * (ids[:, 0] == A_TOK).to(DTYPE) + 0.8 * n_b - (~eos).to(DTYPE)
    return Toy(ids, mask, eos, state, theta, per_token, score)


# --------------------------------------------------------------------------------------------------
# exact gradients


def true_gradient(toy: Toy) -> torch.Tensor:
    """∇J, J = E[sum_t r_t + R], flattened (P·3,)."""
    J = (toy.probs() * toy.returns()).sum()
    (g,) = torch.autograd.grad(J, toy.theta)
    return g.flatten()


def expected_update(toy: Toy, adv: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor):
    """E[sum_t grad log π(a_t|s_t) Â_t] over a batch of rows: ``rows`` (R,) the response of each
    row, ``adv`` (R, L) their advantages (ignored on padding), ``weight`` (R,) each row's
    probability weight (its response's or its group's probability). Flattened (P·3,)."""
    logp = toy.logprobs()[rows]  # (R, L)
    surrogate = (weight[:, None] * torch.where(toy.mask[rows], logp * adv.detach(), 0.0)).sum()
    (g,) = torch.autograd.grad(surrogate, toy.theta)
    return g.flatten()


def single(toy: Toy, estimator: Callable[[Toy, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The expected update of a per-response estimator ``estimator(toy, rows) -> (R, L)``."""
    rows = torch.arange(toy.n)
    return expected_update(toy, estimator(toy, rows), rows, toy.probs().detach())


def grouped(toy: Toy, estimator, G: int) -> torch.Tensor:
    """The expected update of a group estimator ``estimator(toy, rows, group_ids) -> (R, L)`` over
    every G-tuple of responses (rows of a group adjacent), each weighted by its probability."""
    p = toy.probs().detach()
    tuples = torch.cartesian_prod(*[torch.arange(toy.n)] * G).reshape(-1, G)  # (T, G)
    rows = tuples.reshape(-1)
    group_ids = torch.arange(tuples.shape[0]).repeat_interleave(G)
    weight = p[tuples].prod(1).repeat_interleave(G)
    return expected_update(toy, estimator(toy, rows, group_ids), rows, weight)


# --------------------------------------------------------------------------------------------------
# segments and estimators


def segments(toy: Toy, rows: torch.Tensor, macro: MacroConfig) -> MacroSegments:
    """The macro actions of ``rows`` by the rule of ``macro`` (π_old = the policy)."""
    rule = build_termination(macro)
    out = rule(
        TerminationInputs(
            response_ids=toy.ids[rows],
            action_mask=toy.mask[rows],
            ends_with_eos=toy.eos[rows],
            old_logprobs=toy.logprobs().detach()[rows],
            ref_logprobs=toy.logprobs().detach()[rows],
        )
    )
    return build_segments(out.macro_end, toy.mask[rows])


def per_index_advantages(
    toy: Toy, rows: torch.Tensor, group_ids: torch.Tensor, seg: MacroSegments, loo: bool
) -> torch.Tensor:
    """RFC #7244's per-index construction: macro reward ρ_{i,k} (its tokens' rewards, plus R on the
    last macro action), minus b_k = the mean of ρ_{j,k} over the group's samples j that have a
    macro action k (``loo``: j ≠ i), summed over the response's own macro actions from k on."""
    mask = toy.mask[rows]
    kl = toy.kl[rows]
    last = mask & ~torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    rewards = kl + torch.where(last, toy.score[rows][:, None], 0.0)
    rho = to_macro(rewards, seg)  # (R, M)
    valid = seg.mask
    M = rho.shape[1]
    key = group_ids[:, None] * M + torch.arange(M)[None, :]  # (R, M) one bucket per (group, k)
    n_keys = int(key.max()) + 1
    total = torch.zeros(n_keys, dtype=DTYPE).index_add_(0, key[valid], rho[valid])
    count = torch.zeros(n_keys, dtype=DTYPE).index_add_(0, key[valid], torch.ones_like(rho[valid]))
    total, count = total[key], count[key]
    if loo:
        total, count = total - rho, count - 1
    b = torch.where(count > 0, total / count.clamp(min=1), 0.0)
    centred = torch.where(valid, rho - b, 0.0)
    adv = centred.flip(1).cumsum(1).flip(1)  # sum over the response's own k' >= k
    return to_tokens(adv, seg)


def ours(name: str, toy: Toy, rows, group_ids=None, **kw) -> torch.Tensor:
    """(R, L) advantages of this project's estimator ``name`` on ``rows`` (see the module doc)."""
    macro = kw.get("macro", MacroConfig(termination_condition="fixed", ngram=1))
    seg = segments(toy, rows, macro)
    mask = toy.mask[rows]
    inputs = EstimatorInputs(
        kl_rewards=toy.kl[rows], scores=toy.score[rows], action_mask=mask, segments=seg,
        values=toy.values()[rows], group_ids=group_ids,
    )  # fmt: skip
    opts = EstimatorOptions(lam=kw.get("lam", 1.0), value_function=kw.get("vf", "start"))
    if name == "macro_mc":
        C = kw.get("C", 1)
        if kw.get("selection", "spaced") == "spaced":
            bnd = select_spaced_mc_boundaries(seg, C, kw.get("spacing", 2))
        else:
            bnd = select_mc_boundaries(seg, C)
        sv = toy.score_values()[rows]
        values = torch.where(bnd.mask, sv.gather(1, bnd.positions.clamp(min=0)), 0.0)
        inputs.mc = MCValues(bnd, values, prompt_values=sv[:, 0])
    adv, _ = build_estimator(name, opts)(inputs)
    if kw.get("credit", "all") != "all":
        keep = credit_mask(seg, dataclasses.replace(macro, macro_credit=kw["credit"]))
        adv = torch.where(keep, adv, 0.0)
    return adv


@dataclass
class Row:
    name: str
    cosine: float
    scale: float
    residual: float  # |E[g] - c ∇J| / |E[g]|
    eos_bias: float  # the residual's component on the EOS logits (+: pushes towards stopping)


def compare(name: str, g: torch.Tensor, true: torch.Tensor) -> Row:
    c = float(g @ true / (true @ true))
    res = g - c * true
    eos = res.view(-1, 3)[:, EOS].sum() - res.view(-1, 3)[:, :EOS].sum() / 2
    return Row(
        name,
        float(g @ true / (g.norm() * true.norm())),
        c,
        float(res.norm() / g.norm()),
        float(eos / g.norm()),
    )


def cases(G: int = 3) -> dict[str, Callable[[Toy], torch.Tensor]]:
    """Each compared estimator as ``toy -> expected update``."""

    def fixed(n: int, own: bool = True) -> MacroConfig:
        return MacroConfig(termination_condition="fixed", ngram=n, eos_own_macro=own)

    def low(cut: str) -> MacroConfig:
        return MacroConfig(
            termination_condition="lowprob", lowprob_threshold=0.4, lowprob_cut=cut,
            eos_own_macro=False,
        )  # fmt: skip

    f1 = fixed(1)

    def per_index(loo):
        return lambda t: grouped(
            t, lambda t, r, gid: per_index_advantages(t, r, gid, segments(t, r, f1), loo), G
        )

    return {
        "per-index group baseline (RFC #7244, mean incl. self)": per_index(False),
        "per-index group baseline (RFC #7244, leave-one-out)": per_index(True),
        "rloo": lambda t: grouped(t, lambda t, r, gid: ours("rloo", t, r, gid), G),
        "dr_grpo": lambda t: grouped(t, lambda t, r, gid: ours("dr_grpo", t, r, gid), G),
        "grpo": lambda t: grouped(t, lambda t, r, gid: ours("grpo", t, r, gid), G),
        "gae, exact V, start, λ=1, n=1": lambda t: single(t, lambda t, r: ours("gae", t, r)),
        "gae, exact V, start, λ=0.95, n=2, no EOS split": lambda t: single(
            t, lambda t, r: ours("gae", t, r, lam=0.95, macro=fixed(2, False))
        ),
        "gae, exact V, start, λ=0.95, n=2, EOS own macro": lambda t: single(
            t, lambda t, r: ours("gae", t, r, lam=0.95, macro=fixed(2, True))
        ),
        "gae, exact V, equal, λ=0.95, n=2, no EOS split": lambda t: single(
            t, lambda t, r: ours("gae", t, r, lam=0.95, vf="equal", macro=fixed(2, False))
        ),
        "gae, exact V, start, lowprob cut after": lambda t: single(
            t, lambda t, r: ours("gae", t, r, lam=0.95, macro=low("after"))
        ),
        "gae, exact V, start, lowprob cut before": lambda t: single(
            t, lambda t, r: ours("gae", t, r, lam=0.95, macro=low("before"))
        ),
        "gae, exact V, start, n=2, --macro_credit boundary": lambda t: single(
            t, lambda t, r: ours("gae", t, r, macro=fixed(2, False), credit="boundary")
        ),
        "macro_mc, exact V̂, spaced boundaries (C=1)": lambda t: single(
            t, lambda t, r: ours("macro_mc", t, r, selection="spaced")
        ),
        "macro_mc, exact V̂, spread boundaries (C=1)": lambda t: single(
            t, lambda t, r: ours("macro_mc", t, r, selection="spread")
        ),
    }


def report(kl: bool = True, seed: int = 0, G: int = 3) -> list[Row]:
    toy = make_toy(seed=seed, kl=kl)
    true = true_gradient(toy)
    return [compare(name, fn(toy), true) for name, fn in cases(G).items()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="policy initialisations")
    ap.add_argument("--G", type=int, default=3, help="group size of the group estimators")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    for kl in (True, False):
        print(f"\n{'with' if kl else 'without'} per-token rewards (G = {args.G}, seeds {seeds})\n")
        print("| estimator | cosine to ∇J | scale c | residual | EOS-logit bias |")
        print("|---|---|---|---|---|")
        rows = [report(kl, s, args.G) for s in seeds]
        for i, r0 in enumerate(rows[0]):
            per_seed = [r[i] for r in rows]

            def fmt(key: str, per_seed=per_seed) -> str:
                return " / ".join(f"{getattr(r, key):.3f}" for r in per_seed)

            print(
                f"| {r0.name} | {fmt('cosine')} | {fmt('scale')} | {fmt('residual')} | "
                f"{fmt('eos_bias')} |"
            )


if __name__ == "__main__":
    main()
