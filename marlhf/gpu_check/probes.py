"""Measurements on one model in this process: decode throughput against the memory-bandwidth bound,
and the rollout–trainer log-prob mismatch (`marlhf.algo.mismatch`)."""

from __future__ import annotations

import statistics
import time

import torch

from marlhf.algo.mismatch import importance_weights, level_log_ratio, mismatch_metrics
from marlhf.models.decode import release_decoders, sample
from marlhf.models.sequences import pack_flush_left
from marlhf.stages.ppo.forward import policy_forward
from marlhf.stages.ppo.rollout import Rollout


class _Engine(torch.nn.Module):
    """What `marlhf.stages.ppo.forward.policy_forward` uses of a DeepSpeed engine."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kw):
        return self.module(**kw)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, repeats: int) -> tuple[float, object]:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after one warm-up, and its last output."""
    out = fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bytes_per_step(model, batch: int, prompt: int, new_tokens: int) -> dict[str, float]:
    """The bytes one decode step must read, averaged over the steps: every weight once, and the KV
    cache written so far (rows × (prompt + step) positions × layers × 2 × kv heads × head dim)."""
    cfg = model.config
    elt = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * elt
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_position = cfg.num_hidden_layers * 2 * kv_heads * head_dim * elt
    mean_len = prompt + (new_tokens - 1) / 2
    return {"weights": float(weights), "kv": float(batch * mean_len * per_position)}


def decode_throughput(
    model, batch: int, prompt: int, new_tokens: int, bandwidth: float | None, repeats: int = 3
) -> dict:
    """tokens/s of HF ``generate`` and of the static decoder (eager, and CUDA-graphed on CUDA) at
    ``batch × new_tokens`` sampled tokens (no EOS: every row decodes them all), and each one's
    fraction of the weights + KV-cache bandwidth bound (bound time / measured time)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=new_tokens, temperature=0.8, top_k=50, eos_ids=[], pad_id=0)

    def hf():
        return model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.8, top_k=50,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
        )  # fmt: skip

    backends = {"hf_generate": hf, "static_eager": lambda: sample(model, ids, mask, **kw)}
    if device.type == "cuda":
        backends["static_compiled"] = lambda: sample(model, ids, mask, compile=True, **kw)
    traffic = bytes_per_step(model, batch, prompt, new_tokens)
    bound_s = (traffic["weights"] + traffic["kv"]) * new_tokens / bandwidth if bandwidth else None
    out = {"batch": batch, "prompt": prompt, "new_tokens": new_tokens, **traffic}
    out["bound_s"] = bound_s
    with torch.no_grad():
        for name, fn in backends.items():
            try:
                seconds, _ = _timed(fn, device, repeats)
            except Exception as e:  # reported; the other backends still run
                out[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
                continue
            out[name] = {
                "seconds": seconds,
                "tokens_per_s": batch * new_tokens / seconds,
                "ms_per_step": 1e3 * seconds / new_tokens,
                "bound_fraction": bound_s / seconds if bound_s else None,
            }
    release_decoders()
    return out


def rollout_mismatch(
    model, batch: int, prompt: int, new_tokens: int, ngram: int = 5, compile: bool = False
) -> dict:
    """The ``rollout/*`` metrics of ``model`` (`marlhf.algo.mismatch.mismatch_metrics`): the static
    decoder samples ``batch × new_tokens`` (temperature 0.8, top-k 50, no EOS) to random prompts
    and records log π_rollout; the trainer's forward (`policy_forward`, what PPO scores with)
    scores the same tokens. Also: the mean |Σ_t log ρ_t| per response, the share of macro ratios
    (``ngram`` tokens) outside PPO's clip range [0.8, 1.2] and of sequence ratios outside GSPO's
    [1 − 3e-4, 1 + 4e-4] (at an update's first minibatch, where π_θ = π_old, they would be 1), the
    range of the rollout correction's weights (``tis``, cap 2), and the CPU and wall seconds of the
    decode and of the trainer's check (one no-grad forward pass)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, model.config.vocab_size, (batch, prompt), generator=g).to(device)
    pmask = torch.ones_like(prompts)
    seeds = torch.arange(batch, dtype=torch.long) + 1000
    cpu, t = time.process_time(), time.perf_counter()
    resp, logp, _ = sample(
        model, prompts, pmask, max_new_tokens=new_tokens, temperature=0.8, top_k=50, eos_ids=[],
        pad_id=0, row_seeds=seeds, return_logprobs=True, compile=compile,
    )  # fmt: skip
    _sync(device)
    decode = (time.process_time() - cpu, time.perf_counter() - t)
    mask = torch.ones_like(resp, dtype=torch.bool)
    seq, att, start = pack_flush_left(prompts, pmask, resp, mask, pad_id=0)
    ro = Rollout(seq, att, start, resp, mask, torch.zeros(batch, dtype=torch.bool), [""] * batch)
    cpu, t = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        trainer, _ = policy_forward(_Engine(model), ro, 0.8)
    _sync(device)
    check = (time.process_time() - cpu, time.perf_counter() - t)
    seg = (torch.arange(resp.shape[1], device=device) // ngram).expand(batch, -1)
    out = mismatch_metrics(trainer, logp, mask, seg)
    log_rho = trainer.double() - logp.double()
    macro = level_log_ratio(log_rho, mask, "macro", seg).exp()
    gspo = level_log_ratio(log_rho, mask, "sequence").exp()[:, 0]
    out["seq_logprob_diff_mean"] = float(log_rho.sum(1).abs().mean())
    out["macro_outside_clip"] = float(((macro - 1).abs() > 0.2).double().mean())
    out["gspo_outside_clip"] = float(((gspo < 1 - 3e-4) | (gspo > 1 + 4e-4)).double().mean())
    w = importance_weights(trainer, logp, mask, mode="tis", cap=2.0)[mask]
    out["tis_weight_min"], out["tis_weight_max"] = float(w.min()), float(w.max())
    out.update(dtype=str(next(model.parameters()).dtype), batch=batch, new_tokens=new_tokens)
    out.update(decode_cpu_s=decode[0], decode_wall_s=decode[1])
    out.update(check_cpu_s=check[0], check_wall_s=check[1], tokens=int(mask.sum()))
    return out
