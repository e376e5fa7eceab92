"""Time the macro-action core on CPU: each termination rule, build_segments and macro_advantages.

    .venv/bin/python benchmarks/bench_macro.py [--batch 64] [--length 512] [--repeats 7]

Prints the median wall time (ms) per call for a random right-padded batch (B, A).
With ``--ppo_metrics RUN/metrics.jsonl`` (any MA-PPO run, e.g. from ``benchmarks/bench_ppo.py`` or the
demo) each time is also printed as a fraction of that run's median PPO step (``time/step``). Note the
batch shape here (default B=64, A=512) may differ from the run's rollout; pass --batch/--length to match.
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


def ppo_step_fraction(macro_ms: dict[str, float], metrics_path: str | None) -> dict[str, float] | None:
    """Fraction of one PPO step (median ``time/step`` of a run's metrics.jsonl) per timed operation."""
    if not metrics_path:
        return None
    import json

    with open(metrics_path) as f:
        steps = [json.loads(line).get("time/step") for line in f if line.strip()]
    steps = [s for s in steps if s]
    if not steps:
        raise SystemExit(f"{metrics_path}: no time/step rows")
    step_ms = 1000.0 * statistics.median(steps)
    return {name: ms / step_ms for name, ms in macro_ms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--ppo_metrics", default=None, help="metrics.jsonl of a PPO run to relate to")
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
    fractions = ppo_step_fraction(results, args.ppo_metrics)
    if fractions is not None:
        for name, frac in fractions.items():
            print(f"{name:<{width}}  {100 * frac:7.2f}% of a PPO step")


if __name__ == "__main__":
    main()
