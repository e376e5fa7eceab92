"""What scoring and the update use of a DeepSpeed engine: ``Engine`` (``module``, ``train``/``eval``
and the forward, around a plain module) and ``LogitsActor`` (a trainable engine whose logits are a
free parameter; its ``backward`` records the loss)."""

from types import SimpleNamespace

import torch


class Engine(torch.nn.Module):
    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


class LogitsActor:
    """A trainable 'engine': logits are a free (1, T, V) parameter; backward records the loss."""

    def __init__(self, T, V, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.nn.Parameter(torch.randn(1, T, V, generator=g))
        self.losses = []

    def __call__(self, input_ids, attention_mask, use_cache=False):
        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], -1, -1))

    def backward(self, loss):
        self.losses.append(float(loss.detach()))

    def step(self):
        pass
