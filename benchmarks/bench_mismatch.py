"""Rollout–trainer log-prob mismatch of the static decoder, per dtype, and the cost of the trainer's check.

    .venv/bin/python benchmarks/bench_mismatch.py                    # CPU: hidden 512, 6 layers
    python benchmarks/bench_mismatch.py --device cuda --hidden 2048 --layers 16 --vocab 32000 \
        --batch 64 --prompt 128 --new-tokens 128                     # a GPU

A random-initialised Gemma-architecture model samples ``--batch`` responses of ``--new-tokens`` tokens
(no EOS; temperature 0.8, top-k 50) to random prompts with the GPU acceptance run's probe
(`marlhf.gpu_check.probes.rollout_mismatch`): `marlhf.models.decode.sample` records log π_rollout of
each sampled token, and the trainer's forward pass (`marlhf.stages.ppo.forward.policy_forward`, what
PPO scores with) scores the same tokens. Printed per dtype: the ``rollout/*`` metrics
(`marlhf.algo.mismatch.mismatch_metrics`, macro actions of ``--ngram`` tokens), the share of macro
and sequence ratios that the mismatch alone puts outside PPO's clip range [0.8, 1.2] and GSPO's
[1 − 3e-4, 1 + 4e-4] (the ratio at an update's first minibatch, where π_θ = π_old, would be 1), the
rollout correction's weights (`tis`, cap 2) and the CPU (process) and wall seconds of the decode and
of the check (one no-grad forward pass). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json

import torch

from marlhf.gpu_check.probes import rollout_mismatch


def build_gemma(hidden: int, layers: int, vocab: int, dtype, device, seed: int = 0):
    """A random-initialised Gemma-architecture causal LM (head dim 64, MLP 4× hidden)."""
    from transformers import GemmaConfig, GemmaForCausalLM

    heads = max(1, hidden // 64)
    cfg = GemmaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=64, max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    return GemmaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--ngram", type=int, default=5, help="macro-action length of the macro metrics")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--compile", action="store_true", help="CUDA-graph decode step (CUDA only)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    result = {"device": str(device), "hidden": args.hidden, "layers": args.layers}
    for name in args.dtypes.split(","):
        model = build_gemma(args.hidden, args.layers, args.vocab, dtypes[name], device)
        r = rollout_mismatch(
            model, args.batch, args.prompt, args.new_tokens, args.ngram, compile=args.compile
        )
        result[name] = r
        print(
            name,
            " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
        )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
