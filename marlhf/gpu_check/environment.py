"""The environment report: versions, the GPU, the driver and the attention kernels in use."""

from __future__ import annotations

import importlib
import platform
import shutil
import subprocess

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from marlhf.gpu_check.models import gemma_config

# peak memory bandwidth in bytes/s by GPU name (first match of a key in the name): the decode bound
BANDWIDTH = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,  # SXM5, HBM3
    "A100-SXM4-80GB": 2.04e12,
    "A100 80GB PCIe": 1.94e12,
    "A100": 1.56e12,
    "L40S": 0.864e12,
    "A10G": 0.6e12,
}


def bandwidth_of(name: str) -> float | None:
    """Peak memory bandwidth of a GPU from its name (None when unknown)."""
    for key, bw in BANDWIDTH.items():
        if key in name:
            return bw
    return None


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception:  # not installed, or broken: both are what the report says
        return None


def _driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def sdpa_kernels(device: str) -> dict[str, bool]:
    """Which scaled-dot-product-attention kernels run a bf16 causal attention of head dim 256 (the
    Gemma shape) and 64 here: each backend tried alone on a small batch."""
    out = {}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for head_dim in (64, 256):
        q = torch.randn(2, 8, 128, head_dim, device=device, dtype=dtype)
        for name, backend in (
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("math", SDPBackend.MATH),
        ):
            try:
                with sdpa_kernel([backend]):
                    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
                out[f"{name}_d{head_dim}"] = True
            except RuntimeError:
                out[f"{name}_d{head_dim}"] = False
    return out


def environment() -> dict:
    """Versions, device, driver, GPU memory and bandwidth, attention kernels."""
    cuda = torch.cuda.is_available()
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "driver": _driver(),
        "device": "cuda" if cuda else "cpu",
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_gb": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
        "bf16_supported": torch.cuda.is_bf16_supported() if cuda else True,
    }
    for mod in ("deepspeed", "transformers", "tokenizers", "datasets", "peft", "accelerate",
                "flash_attn", "triton", "numpy"):  # fmt: skip
        env[mod] = _version(mod)
    env["bandwidth_bytes_per_s"] = bandwidth_of(env["gpu"] or "")
    env["sdpa"] = sdpa_kernels("cuda" if cuda else "cpu")
    # what transformers picks for a Gemma model built here (sdpa, eager, flash_attention_2)
    try:
        from transformers import GemmaForCausalLM

        model = GemmaForCausalLM(gemma_config(64, 64, 1))
        env["attn_implementation"] = model.config._attn_implementation
    except Exception as e:
        env["attn_implementation"] = f"error: {e}"
    return env
