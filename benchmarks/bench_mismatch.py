"""Rollout–trainer log-prob mismatch of the static decoder, per dtype, and the cost of the trainer's check.

    .venv/bin/python benchmarks/bench_mismatch.py                    # CPU: hidden 512, 6 layers
    python benchmarks/bench_mismatch.py --device cuda --hidden 2048 --layers 16 --vocab 32000 \
        --batch 64 --prompt 128 --new-tokens 128                     # a GPU

A random-initialised Gemma-architecture model samples ``--batch`` responses of ``--new-tokens`` tokens
(no EOS; temperature 0.8, top-k 50) to random prompts with `marlhf.decode.sample`, which records log
π_rollout of each sampled token; the trainer's forward pass (`marlhf.rl.scoring.policy_forward`, what
PPO scores with) then scores the same tokens. Printed per dtype: the ``rollout/*`` metrics
(`marlhf.rl.mismatch.mismatch_metrics`, macro actions of ``--ngram`` tokens), the share of macro and
sequence ratios that the mismatch alone puts outside PPO's clip range [0.8, 1.2] and GSPO's
[1 − 3e-4, 1 + 4e-4] (the ratio at an update's first minibatch, where π_θ = π_old, would be 1), the
rollout correction's weights (`tis`, cap 2) and the CPU (process) and wall seconds of the decode and
of the check (one no-grad forward pass). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


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


class _Engine(torch.nn.Module):
    """What `policy_forward` uses of a DeepSpeed engine: ``module`` and the forward."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kw):
        return self.module(**kw)


def _timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.process_time() - c, time.perf_counter() - w


def measure(model, args, device) -> dict:
    """Sample, score, and compare (one dtype)."""
    from marlhf.decode import sample
    from marlhf.rl.mismatch import importance_weights, level_log_ratio, mismatch_metrics
    from marlhf.rl.rollout import Rollout, pack_flush_left
    from marlhf.rl.scoring import policy_forward

    g = torch.Generator().manual_seed(1)
    B, P, A = args.batch, args.prompt, args.new_tokens
    prompts = torch.randint(3, model.config.vocab_size, (B, P), generator=g).to(device)
    pmask = torch.ones(B, P, dtype=torch.long, device=device)
    seeds = torch.arange(B, dtype=torch.long) + 1000
    (resp, logp, _), cpu_dec, wall_dec = _timed(
        lambda: sample(
            model, prompts, pmask, max_new_tokens=A, temperature=0.8, top_k=50, eos_ids=[1],
            pad_id=0, row_seeds=seeds, return_logprobs=True, compile=args.compile,
        ),
        device,
    )  # fmt: skip
    mask = resp != 0  # no EOS is drawn at these sizes in practice; padding only after one
    seq, att, start = pack_flush_left(prompts, pmask, resp, mask, pad_id=0)
    ro = Rollout(seq, att, start, resp, mask, torch.zeros(B, dtype=torch.bool), [""] * B)
    with torch.inference_mode():
        (trainer, _), cpu_chk, wall_chk = _timed(
            lambda: policy_forward(_Engine(model), ro, 0.8), device
        )
    seg = (torch.arange(resp.shape[1], device=device) // args.ngram).expand(B, -1)
    seg = torch.where(mask, seg, -1)
    out = mismatch_metrics(trainer, logp, mask, seg)
    log_rho = (trainer.double() - logp.double()).masked_fill(~mask, 0)
    macro = level_log_ratio(log_rho, mask, "macro", seg).exp()[mask]
    gspo = level_log_ratio(log_rho, mask, "sequence").exp()[:, 0]
    out["seq_logprob_diff_mean"] = float(log_rho.sum(1).abs().mean())
    out["macro_outside_ppo_clip"] = float(((macro - 1).abs() > 0.2).double().mean())
    out["gspo_outside_clip"] = float(((gspo < 1 - 3e-4) | (gspo > 1 + 4e-4)).double().mean())
    w = importance_weights(trainer, logp, mask, mode="tis", cap=2.0)[mask]
    out["tis_weight_min"], out["tis_weight_max"] = float(w.min()), float(w.max())
    out.update(decode_cpu_s=cpu_dec, decode_wall_s=wall_dec)
    out.update(check_cpu_s=cpu_chk, check_wall_s=wall_chk, tokens=int(mask.sum()))
    return out


def main() -> None:
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
    args = p.parse_args()
    device = torch.device(args.device)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    result = {"device": str(device), "hidden": args.hidden, "layers": args.layers}
    for name in args.dtypes.split(","):
        model = build_gemma(args.hidden, args.layers, args.vocab, dtypes[name], device)
        r = measure(model, args, device)
        result[name] = r
        print(name, " ".join(f"{k}={v:.3g}" for k, v in r.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
