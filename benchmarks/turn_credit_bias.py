"""The enumerable toy of ``credit_bias.py`` extended to turns: is each advantage estimator unbiased
when the policy decides how many turns an episode has (verl RFC #7244: a baseline computed per
turn index is then an action-dependent baseline)?

The toy. An episode is a sequence of policy turns with an observation after each but the last. A
turn is at most ``T`` tokens of ``a``, ``b`` and EOS (``--turn_len``, 2); the environment ends the
turn after T tokens or at EOS. With ``varying`` turns EOS ends the episode (the policy's "end"
action) and an episode without EOS is cut after ``K`` turns (``--max_turns``, 2): the number of
turns is the policy's choice. With a fixed number of turns EOS ends the turn only and every episode
has K turns. The observations are deterministic given the actions before them, so they are context
without a gradient and the policy's state is its own actions so far: as the trainer lays a
multi-turn rollout out, the toy holds the actions only, compacted, with ``turn_end`` (each turn's
last action token) and ``turn_index`` (1, 2, ...). The policy is ``credit_bias.py``'s tabular
softmax (one logit vector per prefix of actions, seeded random values).

Rewards: the outcome R of ``credit_bias.py`` (2·[first token is a] + 0.8·#b − [no EOS at the end])
and the environment's step reward of each turn on its last action token, ``step`` times (1·[the
turn starts with a] + 0.5·#b in the turn − 0.5) (``--step_scale``, 1; 0: none; −1: the rewards
made costs). J = E[Σ step rewards + R].

What is compared: as in ``credit_bias.py``, the exact ∇J (autograd through the enumerated
probabilities) and each estimator's exact expected update, every episode or every group of G = 3
episodes enumerated. The estimators are the project's (:func:`marlhf.algo.estimators.build_estimator`
with the inputs the trainer builds: the ``turn`` rule's segments, the step rewards where the
estimator takes them, :func:`marlhf.algo.estimators.with_turn_rewards`): ``gae`` with exact values
(turn macro actions, ``start`` weighting, λ 1 and 0.95, with and without the EOS split; the default
``equal`` weighting; token level), ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp`` (whitened
over every enumerated group at once: the statistics of a large batch, constants), ``mt_grpo`` (also
with its std division made a constant, ``group_eps`` 1e8, to show the per-turn-index baseline
alone), and the per-index group baseline of RFC #7244 per turn for reference.

    .venv/bin/python benchmarks/turn_credit_bias.py   # the tables of docs/research/estimator-bias.md
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.credit_bias import (  # noqa: E402
    A_TOK,
    B_TOK,
    DTYPE,
    EOS,
    Row,
    Toy,
    compare,
    expected_update,
    per_index_advantages,
    toy_of,
)
from marlhf.algo.estimators import (  # noqa: E402
    EstimatorInputs,
    EstimatorOptions,
    build_estimator,
    estimator_class,
    with_turn_rewards,
)
from marlhf.macro import (  # noqa: E402
    MacroConfig,
    build_segments,
    build_termination,
    termination_inputs,
)
from marlhf.macro.segments import MacroSegments  # noqa: E402


def step_reward(turn: tuple[int, ...]) -> float:
    """The environment's reward of one turn (its action tokens)."""
    return 1.0 * (turn[0] == A_TOK) + 0.5 * sum(t == B_TOK for t in turn) - 0.5


def turn_outcomes(T: int) -> list[tuple[int, ...]]:
    """Every turn of at most ``T`` tokens: some a/b tokens then EOS, or T a/b tokens."""
    ab = (A_TOK, B_TOK)
    ended = [(*p, EOS) for n in range(T) for p in itertools.product(ab, repeat=n)]
    return ended + list(itertools.product(ab, repeat=T))


def episodes(K: int, T: int, varying: bool) -> list[tuple[tuple[int, ...], ...]]:
    """Every episode as its turns. ``varying``: EOS ends the episode, which is cut after ``K``
    turns; else EOS ends the turn and every episode has K turns."""
    if not varying:
        return list(itertools.product(turn_outcomes(T), repeat=K))
    out: list[tuple[tuple[int, ...], ...]] = []

    def extend(done: tuple[tuple[int, ...], ...]) -> None:
        for turn in turn_outcomes(T):
            ep = (*done, turn)
            if turn[-1] == EOS or len(ep) == K:
                out.append(ep)
            else:
                extend(ep)

    extend(())
    return out


@dataclass
class TurnToy:
    """Every episode of the turns toy.

    Fields (N episodes, L = K·T action tokens at most):
        toy: the episodes' actions, policy and rewards (``credit_bias.Toy``); its per-token rewards
            ``kl`` are the step rewards (they make J and the exact values), its score the outcome.
        step: (N, L) float64 — the step rewards, each on its turn's last action token (0 when the
            toy has none).
        turn_end: (N, L) bool — each turn's last action token.
        turn_index: (N, L) long — each action's turn, 1, 2, ...; 0 on padding.
        varying: whether the policy decides the number of turns.
    """

    toy: Toy
    step: torch.Tensor
    turn_end: torch.Tensor
    turn_index: torch.Tensor
    varying: bool


def make_turn_toy(
    K: int = 2, T: int = 2, varying: bool = True, step: float = 1.0, seed: int = 0
) -> TurnToy:
    """The turns toy with at most ``K`` turns of at most ``T`` tokens, the step rewards ``step``
    times :func:`step_reward` (module doc)."""
    eps = episodes(K, T, varying)
    L = K * T
    toy = toy_of([sum(ep, ()) for ep in eps], L, seed=seed, kl=False)
    N = len(eps)
    rewards = torch.zeros(N, L, dtype=DTYPE)
    turn_end = torch.zeros(N, L, dtype=torch.bool)
    turn_index = torch.zeros(N, L, dtype=torch.long)
    for i, ep in enumerate(eps):
        t = 0
        for k, turn in enumerate(ep):
            turn_index[i, t : t + len(turn)] = k + 1
            t += len(turn)
            turn_end[i, t - 1] = True
            rewards[i, t - 1] = step * step_reward(turn)
    return TurnToy(dataclasses.replace(toy, kl=rewards), rewards, turn_end, turn_index, varying)


def true_gradient(tt: TurnToy) -> torch.Tensor:
    """∇J, J = E[Σ step rewards + R], flattened (P·3,)."""
    toy = tt.toy
    J = (toy.probs() * toy.returns()).sum()
    (g,) = torch.autograd.grad(J, toy.theta)
    return g.flatten()


# --------------------------------------------------------------------------------------------------
# the project's estimators on the toy

TURN = MacroConfig(termination_condition="turn", eos_own_macro=False)
TURN_EOS_OWN = MacroConfig(termination_condition="turn")  # --eos_own_macro, the default
TOKEN = MacroConfig(termination_condition="fixed", ngram=1, eos_own_macro=False)


def segments(tt: TurnToy, rows: torch.Tensor, macro: MacroConfig) -> MacroSegments:
    """The macro actions of ``rows`` by the rule of ``macro``, given the turns' ends (π_old = the
    policy), as the trainer builds them (``termination_inputs``)."""
    toy = tt.toy
    rule = build_termination(macro)
    logp = toy.logprobs().detach()[rows]
    inputs = termination_inputs(
        rule, toy.ids[rows], toy.mask[rows], toy.eos[rows],
        ref_logprobs=logp, old_logprobs=logp, turn_end=tt.turn_end[rows],
    )  # fmt: skip
    return build_segments(rule(inputs).macro_end, toy.mask[rows])


def ours(
    name: str,
    tt: TurnToy,
    rows: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    macro: MacroConfig = TURN,
    lam: float = 1.0,
    vf: str = "start",
    group_eps: float = 1e-6,
) -> torch.Tensor:
    """(R, L) advantages of the project's estimator ``name`` on ``rows``: the trainer's inputs
    (no per-token KL rewards, the outcome as the score, the step rewards where the estimator takes
    them, exact values for ``gae``)."""
    toy = tt.toy
    mask = toy.mask[rows]
    inputs = EstimatorInputs(
        kl_rewards=torch.zeros(mask.shape, dtype=DTYPE), scores=toy.score[rows],
        action_mask=mask, segments=segments(tt, rows, macro), values=toy.values()[rows],
        group_ids=group_ids,
    )  # fmt: skip
    how = estimator_class(name).turn_rewards
    inputs = with_turn_rewards(inputs, how, tt.step[rows], tt.turn_end[rows], tt.turn_index[rows])
    opts = EstimatorOptions(lam=lam, value_function=vf, group_eps=group_eps)
    adv, _ = build_estimator(name, opts)(inputs)
    return adv


def single(tt: TurnToy, estimator: Callable[[TurnToy, torch.Tensor], torch.Tensor]):
    """The expected update of a per-episode estimator."""
    rows = torch.arange(tt.toy.n)
    return expected_update(tt.toy, estimator(tt, rows), rows, tt.toy.probs().detach())


def grouped(tt: TurnToy, estimator, G: int) -> torch.Tensor:
    """The expected update of a group estimator over every G-tuple of episodes (rows of a group
    adjacent), each weighted by its probability (``credit_bias.grouped`` on the turns toy)."""
    toy = tt.toy
    p = toy.probs().detach()
    tuples = torch.cartesian_prod(*[torch.arange(toy.n)] * G).reshape(-1, G)  # (Tu, G)
    rows = tuples.reshape(-1)
    group_ids = torch.arange(tuples.shape[0]).repeat_interleave(G)
    weight = p[tuples].prod(1).repeat_interleave(G)
    return expected_update(toy, estimator(tt, rows, group_ids), rows, weight)


def cases(G: int = 3) -> dict[str, Callable[[TurnToy], torch.Tensor]]:
    """Each compared estimator as ``turn toy -> expected update``."""

    def group(name: str, **kw):
        return lambda tt: grouped(tt, lambda tt, r, gid: ours(name, tt, r, gid, **kw), G)

    def gae(**kw):
        return lambda tt: single(tt, lambda tt, r: ours("gae", tt, r, **kw))

    def per_index(loo: bool):
        def adv(tt, r, gid):
            return per_index_advantages(tt.toy, r, gid, segments(tt, r, TURN), loo)

        return lambda tt: grouped(tt, adv, G)

    return {
        "per-turn-index group baseline (RFC #7244, mean incl. self)": per_index(False),
        "per-turn-index group baseline (RFC #7244, leave-one-out)": per_index(True),
        "mt_grpo": group("mt_grpo"),
        "mt_grpo, std division off (group_eps 1e8)": group("mt_grpo", group_eps=1e8),
        "grpo": group("grpo"),
        "dr_grpo": group("dr_grpo"),
        "rloo": group("rloo"),
        "reinforce_pp (whitened over a large batch)": group("reinforce_pp"),
        "gae, exact V, turn, start, λ=1, --no_eos_own_macro": gae(),
        "gae, exact V, turn, start, λ=0.95, --no_eos_own_macro": gae(lam=0.95),
        "gae, exact V, turn, start, λ=0.95, EOS own macro": gae(lam=0.95, macro=TURN_EOS_OWN),
        "gae, exact V, turn, equal, λ=0.95, EOS own macro": gae(
            lam=0.95, vf="equal", macro=TURN_EOS_OWN
        ),
        "gae, exact V, token level, λ=0.95": gae(lam=0.95, macro=TOKEN),
    }


def report(varying: bool, step: float, seed: int = 0, G: int = 3, K: int = 2, T: int = 2):
    tt = make_turn_toy(K, T, varying=varying, step=step, seed=seed)
    true = true_gradient(tt)
    return [compare(name, fn(tt), true) for name, fn in cases(G).items()]


def print_table(rows: list[list[Row]]) -> None:
    print("| estimator | cosine to ∇J | scale c | residual | EOS-logit bias |")
    print("|---|---|---|---|---|")
    for i, r0 in enumerate(rows[0]):
        per_seed = [r[i] for r in rows]

        def fmt(key: str, per_seed=per_seed) -> str:
            spec = ".3g" if key == "scale" else ".3f"  # the scale of group_eps 1e8: ~1e-8
            return " / ".join(f"{getattr(r, key):{spec}}" for r in per_seed)

        print(
            f"| {r0.name} | {fmt('cosine')} | {fmt('scale')} | {fmt('residual')} | "
            f"{fmt('eos_bias')} |"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="policy initialisations")
    ap.add_argument("--G", type=int, default=3, help="group size of the group estimators")
    ap.add_argument("--max_turns", type=int, default=2, help="K: the most turns of an episode")
    ap.add_argument("--turn_len", type=int, default=2, help="T: the most tokens of a turn")
    ap.add_argument(
        "--step_scale", type=float, default=1.0, help="the step rewards' factor (-1: costs)"
    )
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.perf_counter()
    for varying in (True, False):
        for step in (args.step_scale, 0.0):
            n = len(episodes(args.max_turns, args.turn_len, varying))
            turns = (
                f"the policy decides the number of turns (EOS ends the episode; 1 to "
                f"{args.max_turns} turns)"
                if varying
                else f"{args.max_turns} turns always (EOS ends the turn)"
            )
            rewards = f"step rewards × {step:g} and the outcome" if step else "the outcome only"
            print(
                f"\n{turns}; {rewards}; {n} episodes, turns of at most {args.turn_len} tokens "
                f"(G = {args.G}, seeds {seeds})\n"
            )
            rows = [report(varying, step, s, args.G, args.max_turns, args.turn_len) for s in seeds]
            print_table(rows)
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
