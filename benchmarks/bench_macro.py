"""Time the macro-action core on CPU: each termination rule, build_segments and macro_advantages.

    .venv/bin/python benchmarks/bench_macro.py [--batch 64] [--length 512] [--repeats 7]

Prints the median wall time (ms) per call for a random right-padded batch (B, A).
`ppo_step_fraction` is the hook for relating these times to a tiny-model PPO step (to be filled in
once the PPO trainer exists).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from marlhf.macro import (
    MacroConfig,
    TerminationInputs,
    build_segments,
    build_termination,
    macro_advantages,
)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def make_inputs(B: int, A: int, seed: int = 0) -> TerminationInputs:
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(A // 4, A + 1, (B,), generator=g)
    mask = torch.arange(A)[None, :] < n_valid[:, None]
    return TerminationInputs(
        response_ids=torch.randint(0, 32000, (B, A), generator=g),
        action_mask=mask,
        ends_with_eos=torch.rand(B, generator=g) < 0.8,
        ref_logprobs=-torch.rand(B, A, generator=g) * 5,
        ref_entropy=torch.rand(B, A, generator=g) * 4,
        generator=g,
    )


def bench_macro_core(B: int = 64, A: int = 512, repeats: int = 7) -> dict[str, float]:
    """Median ms per call of each rule, build_segments and macro_advantages on a (B, A) batch."""
    inputs = make_inputs(B, A)
    configs = {
        "fixed (n=5)": MacroConfig(termination_condition="fixed", ngram=5),
        "randomized (original)": MacroConfig(termination_condition="randomized"),
        "randomized (resample)": MacroConfig(
            termination_condition="randomized", randomized_mode="resample"
        ),
        "ppl": MacroConfig(termination_condition="ppl"),
        "entropy (tau=2)": MacroConfig(termination_condition="entropy"),
        "entropy (target 5)": MacroConfig(termination_condition="entropy", target_macro_len=5.0),
    }
    results = {}
    for name, cfg in configs.items():
        rule = build_termination(cfg)
        results[f"rule: {name}"] = median_ms(lambda rule=rule: rule(inputs), repeats)
    macro_end = build_termination(configs["fixed (n=5)"])(inputs).macro_end
    results["build_segments"] = median_ms(
        lambda: build_segments(macro_end, inputs.action_mask), repeats
    )
    seg = build_segments(macro_end, inputs.action_mask)
    rewards = torch.randn(B, A)
    values = torch.randn(B, A)
    results["macro_advantages (n=5)"] = median_ms(
        lambda: macro_advantages(rewards, values, inputs.action_mask, seg, gamma=1.0, lam=0.95),
        repeats,
    )
    seg1 = build_segments(inputs.action_mask.clone(), inputs.action_mask)
    results["macro_advantages (n=1)"] = median_ms(
        lambda: macro_advantages(rewards, values, inputs.action_mask, seg1, gamma=1.0, lam=0.95),
        repeats,
    )
    return results


def ppo_step_fraction(macro_ms: dict[str, float]) -> dict[str, float] | None:
    """Fraction of one tiny-model PPO step spent in the macro-action core.

    TODO(lead): time one MA-PPO step of the tiny model (generation + scoring + update) and return
    {name: ms / step_ms}. Returns None until the PPO trainer exists.
    """
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = bench_macro_core(args.batch, args.length, args.repeats)
    print(
        f"macro-action core, B={args.batch} A={args.length}, CPU, {args.threads} thread(s), "
        f"median of {args.repeats}"
    )
    width = max(len(k) for k in results)
    print(f"{'operation':<{width}}  {'ms':>8}")
    for name, ms in results.items():
        print(f"{name:<{width}}  {ms:8.2f}")
    fractions = ppo_step_fraction(results)
    if fractions is not None:
        for name, frac in fractions.items():
            print(f"{name:<{width}}  {100 * frac:7.2f}% of a PPO step")


if __name__ == "__main__":
    main()
