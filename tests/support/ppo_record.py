"""``python -m marlhf.stages.ppo`` with recording hooks, for tests/stages/ppo/test_distributed.py.

Run like the stage (``python tests/support/ppo_record.py ARGS`` or under ``torchrun``); the program is
unchanged, but every PPO step saves ``<output_dir>/record/step-<k>-rank-<r>.pt`` with what this rank
generated, the experience the update saw, the rows of each minibatch this rank trained on and the
rows that went through the critic's forward passes (scoring and update).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import marlhf.stages.ppo.loop as loop
import marlhf.stages.ppo.main as stage
import marlhf.stages.ppo.update as update
from marlhf.runtime.distributed import rank
from marlhf.stages.exits import run_program

_generate, _ppo_update, _minibatches = loop.generate, loop.ppo_update, update.minibatches
_setup = loop.setup
_generated: list[dict] = []
_parts: list[list[int]] = []
_steps = [0]
_critic_rows = [0]


def setup(cfg):
    run = _setup(cfg)
    critic = run.models.critic
    if critic is not None:  # count the rows of every critic forward pass
        forward = critic.forward

        def counted(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            positions = kwargs.get("position_ids")
            # packed rows (marlhf.models.packing): one row per position 0
            rows = ids.shape[0] if positions is None else (positions == 0).sum()
            _critic_rows[0] += int(rows)
            return forward(*args, **kwargs)

        critic.forward = counted
    return run


def generate(*args, **kwargs):
    ro = _generate(*args, **kwargs)
    _generated.append(
        {
            "prompt_ids": list(ro.prompt_ids),
            "response_ids": ro.response_ids.cpu(),
            "action_mask": ro.action_mask.cpu(),
        }
    )
    return ro


def minibatches(*args, **kwargs):
    for m in _minibatches(*args, **kwargs):
        _parts.append(m.idx.tolist())
        yield m


def ppo_update(models, exp, cfg, *args, **kwargs):
    out = _ppo_update(models, exp, cfg, *args, **kwargs)
    _steps[0] += 1
    fields = ("old_logprobs", "ref_logprobs", "values", "scores", "rewards", "advantages")
    record = {
        k: None if getattr(exp, k) is None else getattr(exp, k).detach().cpu()
        for k in (*fields, "returns", "segment_ids", "mc_positions", "mc_values")
    }  # returns: None for a critic-free estimator; mc_*: macro_mc only
    record.update(
        prompt_ids=list(exp.rollout.prompt_ids),
        sequences=exp.rollout.sequences.cpu(),
        attention_mask=exp.rollout.attention_mask.cpu(),
        response_start=exp.rollout.response_start.cpu(),
        response_ids=exp.rollout.response_ids.cpu(),
        action_mask=exp.rollout.action_mask.cpu(),
        generated=list(_generated),
        minibatch_rows=list(_parts),
        critic_rows=_critic_rows[0],
        stats=dict(exp.stats),
        update=dict(out),
    )
    path = Path(cfg.log.output_dir) / "record" / f"step-{_steps[0]}-rank-{rank()}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, path)
    _generated.clear()
    _parts.clear()
    _critic_rows[0] = 0
    return out


loop.generate, loop.ppo_update, update.minibatches = generate, ppo_update, minibatches
loop.setup = setup

if __name__ == "__main__":
    run_program(lambda: stage.main(sys.argv[1:]))
