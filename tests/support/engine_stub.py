"""What scoring and the update use of a DeepSpeed engine: ``module``, ``train``/``eval`` and the
forward, around a plain module (tests/rl imports it as ``from engine_stub import Engine``)."""

import torch


class Engine(torch.nn.Module):
    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)
