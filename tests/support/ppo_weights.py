"""The weights of PPO runs in tests: what a run saved, what it started from, and the check that two
runs made the same update (tests/stages/ppo/test_distributed.py, test_ppo_fast_paths.py)."""

from __future__ import annotations

from pathlib import Path

import torch


def saved_weights(out: Path) -> tuple[dict, ...]:
    """State dicts (fp32) of the run's saved actor and, when it trained one, its critic."""
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import load_reward_model

    actor = AutoModelForCausalLM.from_pretrained(out / "actor", dtype=torch.float32).state_dict()
    if not (out / "critic").exists():  # a critic-free estimator
        return (actor,)
    critic, _ = load_reward_model(out / "critic", dtype=torch.float32)
    return actor, critic.state_dict()


def initial_weights(base: Path) -> tuple[dict, dict]:
    """State dicts (fp32) the runs started from: ``base/actor`` and the critic's ``base/rm``."""
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import load_reward_model

    actor = AutoModelForCausalLM.from_pretrained(base / "actor", dtype=torch.float32)
    critic, _ = load_reward_model(base / "rm", dtype=torch.float32)
    return actor.state_dict(), critic.state_dict()


def assert_same_update(inits, want, got, rel: float) -> None:
    """Per model: the runs moved the weights (by more than 1e-4) and ``got`` lies within ``rel`` of
    that step's size from ``want``."""
    for init, a, b in zip(inits, want, got, strict=True):
        assert set(a) == set(b)
        step = max(float((a[k] - init[k]).abs().max()) for k in a)
        diff = max(float((b[k] - a[k]).abs().max()) for k in a)
        assert step > 1e-4  # the PPO steps moved the weights
        assert diff < rel * step, (diff, step)


def update_gap(init: dict, want: dict, got: dict) -> float:
    """``‖got − want‖ / ‖want − init‖`` over all weights of one model (norms): how far apart two
    runs' updates are for the size of the update. Adam divides each weight's step by its gradient's
    size, so weights whose gradient is near 0 amplify rounding in the largest difference
    (:func:`assert_same_update`); the norm weighs each weight by how far it moved."""
    step = sum(float((want[k].float() - init[k].float()).square().sum()) for k in want)
    gap = sum(float((got[k].float() - want[k].float()).square().sum()) for k in want)
    assert step > 0
    return (gap / step) ** 0.5
