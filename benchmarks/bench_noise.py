"""Cost of the sampling noise per decode step: counter-based (``row_seeds``) against ``torch.rand``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_noise.py --batch 64 --vocab 1024 262144

For each vocabulary size, the median wall time over ``--repeats`` calls (after one warm-up) of

- ``rand_noise``: ``marlhf.models.decode._exp_noise`` on (B, V), the generator path's Exp(1) draw;
- ``counter_noise``: ``marlhf.models.decode.counter_noise`` on (B, V), the ``row_seeds`` path's draw;
- ``draw_rand`` / ``draw_counter``: a whole token draw from random logits (temperature, softmax,
  argmax, noise included) with ``top_k=0``, and ``*_top50`` with ``--top_k`` (default 50), where
  ``draw_counter`` makes noise for the k candidates only.

Eager on ``--device`` (on CUDA the decode step's compiled graph would fuse the counter noise into one
kernel; this measures the unfused ops). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from marlhf.models.decode import _exp_noise, counter_noise, draw, draw_counter


def _median_ms(fn, repeats: int, device: torch.device) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    fn(0)
    sync()
    times = []
    for i in range(1, repeats + 1):
        t0 = time.perf_counter()
        fn(i)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _measure(B: int, V: int, k: int, seeds, repeats: int, device: torch.device) -> dict:
    logits = torch.randn(B, V, device=device)
    vocab = torch.arange(V, device=device)
    fns = {
        "rand_noise": lambda i: _exp_noise((B, V), device, None),
        "counter_noise": lambda i: counter_noise(seeds, i, vocab),
        "draw_rand": lambda i: draw(logits, _exp_noise((B, V), device, None), 1.0, 0, 1.0),
        "draw_counter": lambda i: draw_counter(logits, seeds, i, 1.0, 0, 1.0),
        f"draw_rand_top{k}": lambda i: draw(logits, _exp_noise((B, V), device, None), 1.0, k, 1.0),
        f"draw_counter_top{k}": lambda i: draw_counter(logits, seeds, i, 1.0, k, 1.0),
    }
    return {name: _median_ms(fn, repeats, device) for name, fn in fns.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, nargs="+", default=[1024, 262144])
    p.add_argument("--top_k", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device, B = torch.device(args.device), args.batch
    seeds = torch.arange(B, device=device) * 7919 + 1
    results: dict = {"batch": B, "device": str(device), "threads": torch.get_num_threads()}
    print(f"B={B} device={device} threads={torch.get_num_threads()}  median ms per call")
    for V in args.vocab:
        row = _measure(B, V, args.top_k, seeds, args.repeats, device)
        results[f"V={V}"] = row
        print(f"V={V:>7}  " + "  ".join(f"{n} {ms:.2f}" for n, ms in row.items()))
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
