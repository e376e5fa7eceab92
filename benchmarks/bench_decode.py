"""Rollout decoding speed: `generate` vs `marlhf.models.decode.sample` (eager, and compiled on CUDA)
vs vLLM.

    .venv/bin/python benchmarks/bench_decode.py                       # CPU-small defaults
    python benchmarks/bench_decode.py --device cuda --hidden 768 --layers 12 --batch 64 \
        --prompt 128 --new-tokens 128 --dtype bf16                    # 134 M Llama on a GPU

A random-initialised Llama (or `--arch gemma`) with random prompts; every row decodes exactly
`--new-tokens` tokens (no EOS), sampling with temperature 0.8 and top-k 50. For each backend it prints
the median over `--repeats` runs (after one warm-up) of the decode time, tokens/s, ms per decode
step and CPU seconds of this process, and the ratio to `generate` measured in this run. Where vLLM
is installed (`make install-vllm`: run it with `.venv-vllm/bin/python`) the `vllm` backend is the
engine of `--generation_backend vllm` (`marlhf.models.vllm_engine`, in this process, per-row seeds,
log-probs recorded) on the same model, saved to a temporary directory; `--no-vllm` skips it. With a
bandwidth (default 3.35e12 B/s, the H100 SXM; `--bandwidth 0` turns it off) it also prints the
weights-only memory-bandwidth bound: parameter bytes × steps / bandwidth — on a CPU pass the
machine's figure or 0. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib.util import find_spec

import torch


def build_model(arch: str, hidden: int, layers: int, vocab: int, dtype, device):
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // 64)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=max(64, hidden * 8 // 3 // 64 * 64),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(0)
    if arch == "gemma":
        model = GemmaForCausalLM(GemmaConfig(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    return model.to(device=device, dtype=dtype).eval()


def vllm_backend(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, dtype: str):
    """The vLLM engine of ``--generation_backend vllm`` on ``model`` (saved to a temporary
    directory), as a function that samples ``new_tokens`` tokens for every row (no stop token)."""
    import tempfile

    from marlhf.models.vllm_engine import VLLMEngine

    path = tempfile.mkdtemp(prefix="bench-vllm-")
    model.save_pretrained(path)
    B, P = ids.shape
    engine = VLLMEngine(
        path, temperature=0.8, max_model_len=P + new_tokens, max_num_seqs=B, dtype=dtype, seed=0
    )
    seeds = torch.arange(B)

    def fn():
        out, _ = engine.sample(
            ids, mask, max_new_tokens=new_tokens, top_k=50, top_p=1.0, eos_ids=[], pad_id=0,
            row_seeds=seeds,
        )  # fmt: skip
        assert out.shape == (B, new_tokens)

    return fn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (this process, all threads) of ``fn``."""
    fn()  # warm-up (and CUDA-graph capture for the compiled step)
    times, cpu = [], []
    for _ in range(repeats):
        _sync(device)
        t, c = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(times), statistics.median(cpu)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("llama", "gemma"), default="llama")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help="memory bandwidth, B/s (default 3.35e12 on CUDA, none on CPU; 0: no bound)",
    )
    p.add_argument("--no-compile", action="store_true", help="skip the compiled backend")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM backend")
    args = p.parse_args(argv)

    from marlhf.models.decode import sample

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    bandwidth = args.bandwidth
    if bandwidth is None:
        bandwidth = 3.35e12 if device.type == "cuda" else 0.0
    model = build_model(args.arch, args.hidden, args.layers, args.vocab, dtype, device)
    n_params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    B, P, R = args.batch, args.prompt, args.new_tokens
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(3, args.vocab, (B, P), generator=g, device=device)
    mask = torch.ones_like(ids)
    mask[: B // 2, : P // 4] = 0  # half the rows left-padded
    ids = ids.masked_fill(mask == 0, 0)

    def run_generate():
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=0.8,
                top_k=50,
                max_new_tokens=R,
                min_new_tokens=R,
                pad_token_id=0,
            )
        assert out.shape[1] == P + R

    def run_sample(compile_: bool):
        def fn():
            out = sample(
                model,
                ids,
                mask,
                max_new_tokens=R,
                temperature=0.8,
                top_k=50,
                eos_ids=[],
                pad_id=0,
                generator=g,
                compile=compile_,
                prompt_bucket=P,  # every call has the same shape: no extra padding
            )
            assert out.shape == (B, R)

        return fn

    backends = {"generate": run_generate, "static": run_sample(False)}
    if device.type == "cuda" and not args.no_compile:
        backends["static_compiled"] = run_sample(True)
    if not args.no_vllm and find_spec("vllm") is not None:
        backends["vllm"] = vllm_backend(model, ids, mask, R, args.dtype)

    res: dict = {
        "device": str(device),
        "arch": args.arch,
        "params_M": round(n_params / 1e6, 2),
        "batch": B,
        "prompt": P,
        "new_tokens": R,
        "dtype": args.dtype,
    }
    if bandwidth > 0:
        bound_s = param_bytes * R / bandwidth
        res["bandwidth_Bps"] = bandwidth
        res["bound_ms_per_step"] = round(bound_s / R * 1000, 4)
        res["bound_tok_s"] = round(B * R / bound_s)
    print(
        f"{args.arch} {n_params / 1e6:.2f} M params on {device}, batch {B}, prompt {P}, "
        f"{R} new tokens, {args.dtype}"
    )
    for name, fn in backends.items():
        try:
            sec, cpu_sec = timed(fn, device, args.repeats)
        except Exception as e:  # a backend that fails is reported, the others still run
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{name:16s} FAILED {res[f'{name}_error']}")
            continue
        res[f"{name}_s"] = round(sec, 4)
        res[f"{name}_tok_s"] = round(B * R / sec, 1)
        res[f"{name}_ms_per_step"] = round(sec / R * 1000, 3)
        res[f"{name}_cpu_s"] = round(cpu_sec, 4)
        line = (
            f"{name:16s} {sec:8.3f} s  {B * R / sec:10.1f} tok/s  {sec / R * 1000:8.3f} ms/step  "
            f"{cpu_sec:7.3f} CPU s"
        )
        if "generate_s" in res and name != "generate":
            res[f"{name}_speedup_vs_generate"] = round(res["generate_s"] / sec, 2)
            line += f"  ×{res['generate_s'] / sec:.2f} vs generate"
        if bandwidth > 0:
            res[f"{name}_x_bound"] = round(sec / (param_bytes * R / bandwidth), 1)
            line += f"  {res[f'{name}_x_bound']}× the bandwidth bound"
        print(line)
    if bandwidth > 0:
        print(
            f"{'bound':16s} {param_bytes * R / bandwidth:8.4f} s  {res['bound_tok_s']:10d} tok/s  "
            f"{res['bound_ms_per_step']:8.4f} ms/step  (weights only, {bandwidth:.3g} B/s)"
        )
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
