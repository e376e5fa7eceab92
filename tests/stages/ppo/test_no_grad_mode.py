"""Scoring runs under inference mode, except around a trained ZeRO-3 engine, whose persistent
parameters would stay inference tensors after a first gather there (tests/test_multinode.py runs
the two-rank ZeRO-3 case end to end)."""

import torch

import marlhf.stages.ppo.forward as forward
from marlhf.stages.ppo.forward import lockstep
from marlhf.stages.ppo.scoring import no_grad_mode


class _Engine:
    def __init__(self, stage: int, trained: bool):
        self.optimizer = object() if trained else None
        self._stage = stage

    def zero_optimization_stage(self) -> int:
        return self._stage


def _mode(*engines) -> str:
    with no_grad_mode(*engines):
        x = torch.ones(2)
        return (
            "inference"
            if x.is_inference()
            else ("no_grad" if not torch.is_grad_enabled() else "grad")
        )


def test_inference_mode_unless_a_trained_zero3_engine():
    assert _mode(_Engine(0, True), None) == "inference"
    assert _mode(_Engine(2, True), _Engine(3, False)) == "inference"  # a frozen ZeRO-3 engine
    assert _mode(_Engine(0, True), _Engine(3, True)) == "no_grad"
    assert _mode(torch.nn.Linear(2, 2)) == "inference"  # a plain module (tests' engine stubs)


def test_zero3_engines_on_several_ranks_run_one_pass(monkeypatch):
    """A ZeRO-3 engine gathers weights with a collective in every forward pass: on several ranks
    each batch goes through it in one pass (no length groups, no logit chunks), so every rank runs
    the same number of passes whatever its rows' lengths."""
    assert not lockstep(_Engine(3, True))  # one process: nothing to keep in step
    monkeypatch.setattr(forward, "world_size", lambda: 2)
    assert lockstep(_Engine(3, True)) and lockstep(_Engine(3, False))
    assert not lockstep(_Engine(2, True)) and not lockstep(torch.nn.Linear(2, 2))
