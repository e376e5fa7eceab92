"""Exponential moving average of a model's weights (``--enable_ema``), kept in fp32 on the CPU so it
costs no accelerator memory. Under ZeRO-3 each parameter is gathered in turn for the update."""

from __future__ import annotations

from contextlib import nullcontext

import torch


class EMA:
    def __init__(self, module: torch.nn.Module, decay: float, zero3: bool = False):
        self.decay = decay
        self.zero3 = zero3
        self.shadow: dict[str, torch.Tensor] = {}
        self._visit(
            module, lambda name, p: self.shadow.__setitem__(name, p.detach().float().cpu().clone())
        )

    def _visit(self, module: torch.nn.Module, fn) -> None:
        for name, p in module.named_parameters():
            ctx = nullcontext()
            if self.zero3:
                import deepspeed

                ctx = deepspeed.zero.GatheredParameters([p], modifier_rank=None)
            with ctx:
                fn(name, p)

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        """shadow ← decay · shadow + (1 − decay) · θ"""
        d = self.decay

        def step(name: str, p: torch.Tensor) -> None:
            self.shadow[name].mul_(d).add_(p.detach().float().cpu(), alpha=1.0 - d)

        self._visit(module, step)

    def state_dict(self, like: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The averaged weights, cast to the dtypes of ``like`` (a model state dict) when given;
        buffers missing from the shadow are taken from ``like``."""
        if like is None:
            return dict(self.shadow)
        out = {k: v.clone() for k, v in like.items()}
        for k, v in self.shadow.items():
            if k in out:
                out[k] = v.to(out[k].dtype)
        return out
