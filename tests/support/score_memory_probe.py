"""Peak memory of the chunked log-prob paths at a large vocabulary, for tests/stages/ppo/test_score_memory.py.

Run in its own process with glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` and ``MALLOC_TRIM_THRESHOLD_=0``
so every large buffer is its own mapping, returned to the system when freed: the resident set size
then follows the live tensors, and the peak RSS above the RSS before a call (the kernel's high-water
mark, reset with ``/proc/self/clear_refs``) is what the call allocated at its peak. Prints one JSON
object: per case the peak in MiB, the reference sizes, and the largest difference between the
chunked and the unchunked results.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

MIB = 2**20


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def peak_mb(fn):
    """(result, MiB allocated at the peak of ``fn()`` above the RSS before it)."""
    from marlhf.runtime.resources import peak_rss_mb, reset_peak_rss

    before = _rss_mb()
    if not reset_peak_rss():
        raise RuntimeError("cannot reset the peak RSS mark")
    out = fn()
    return out, peak_rss_mb() - before


def function_case(V: int = 131072, B: int = 2, T: int = 64) -> dict:
    """token_logprobs + entropy_from_logits on (B, T, V) float32 logits, 4 MiB blocks, vs
    log_softmax over the whole tensor."""
    from marlhf.models.logprobs import entropy_from_logits, token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=g) * 3
    labels = torch.randint(0, V, (B, T), generator=g)
    block = 2**20

    def chunked():
        return (
            token_logprobs(logits, labels, temperature=0.8, chunk_elements=block),
            entropy_from_logits(logits, temperature=0.8, chunk_elements=block),
        )

    def unchunked():
        logp = torch.log_softmax(logits / 0.8, dim=-1)
        return logp.gather(-1, labels[..., None])[..., 0], -(logp.exp() * logp).sum(-1)

    (a_lp, a_ent), chunked_mb = peak_mb(chunked)
    (b_lp, b_ent), unchunked_mb = peak_mb(unchunked)
    exact = torch.log_softmax(logits.double() / 0.8, dim=-1)  # float64 reference, after measuring
    e_lp, e_ent = exact.gather(-1, labels[..., None])[..., 0], -(exact.exp() * exact).sum(-1)

    def err(lp, ent):
        return max(float((lp - e_lp).abs().max()), float((ent - e_ent).abs().max()))

    return {
        "logits_mb": logits.numel() * 4 / MIB,
        "block_mb": block * 4 / MIB,
        "chunked_mb": chunked_mb,
        "unchunked_mb": unchunked_mb,
        "chunked_err": err(a_lp, a_ent),
        "unchunked_err": err(b_lp, b_ent),
    }


class _Engine:
    """What policy_forward uses of an engine: ``module`` and the call."""

    def __init__(self, module):
        self.module = module

    def __call__(self, **kw):
        return self.module(**kw)


def model_case(V: int = 131072, B: int = 8, P: int = 32, A: int = 64) -> dict:
    """A score pass (`policy_forward`, no grad) of a 1-layer hidden-16 Llama with a V-token
    vocabulary: the default path scored in row chunks of at most 2^22 logits, against the
    reference path (full (B, T, V) logits)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from marlhf.models.sequences import pack_flush_left, response_mask
    from marlhf.stages.ppo.forward import policy_forward
    from marlhf.stages.ppo.rollout import Rollout

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, pad_token_id=0,
    )  # fmt: skip
    engine = _Engine(LlamaForCausalLM(cfg).eval())
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, V, (B, P), generator=g)
    pmask = torch.ones(B, P, dtype=torch.long)
    pmask[::2, : P // 2] = 0  # left padding on every other row
    resp = torch.randint(3, V, (B, A), generator=g)
    resp[1, A // 2] = 2  # one early EOS
    amask, ends = response_mask(resp, eos_ids=[2])
    seq, att, start = pack_flush_left(prompt, pmask, resp, amask, pad_id=0)
    ro = Rollout(seq, att, start, resp, amask, ends, [str(i) for i in range(B)])
    with torch.no_grad():
        (lp, ent), fast_mb = peak_mb(
            lambda: policy_forward(engine, ro, 0.8, with_entropy=True, chunk_elements=2**22)
        )
        (ref_lp, ref_ent), full_mb = peak_mb(
            lambda: policy_forward(engine, ro, 0.8, with_entropy=True, all_positions=True)
        )
    T = seq.shape[1]
    return {
        "full_logits_mb": B * T * V * 4 / MIB,
        "fast_mb": fast_mb,
        "reference_mb": full_mb,
        "max_diff": max(
            float((lp - ref_lp)[amask].abs().max()), float((ent - ref_ent)[amask].abs().max())
        ),
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps({"function": function_case(), "model": model_case()}))
