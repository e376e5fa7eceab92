"""``python -m marlhf.stages.ppo`` with recording hooks, for tests/with_vllm/test_vllm_ppo*.py.

Run like the stage (``python tests/support/vllm_record.py ARGS`` or under ``torchrun``); the program is
unchanged, but (a multi-turn rollout of ``--env`` as a single-turn one, its actions read where they
sit in the conversations)

- every weight sync after an update saves ``<output_dir>/record/sync-<k>-rank-<r>.pt``: the largest
  difference between the engine's log-probs and the trainer's (the actor's forward pass, the
  scoring code) on this rank's last rollout, just before the sync and just after it, and the
  largest difference, over the step's rollouts, between the log-probs the engine recorded while
  sampling and π_old as scoring computed it with the actor; a multi-turn step's rollouts are
  saved too (``turns``: the conversations, where their actions and each turn's reward sit);
- every scoring checks that the engine's record is the behaviour policy and the actor's score is
  π_old (``Scored.rollout_logprobs`` is the rollout's ``logprobs``, ``old_logprobs`` the
  ``trainer_logprobs``); a sync's record counts the scorings where that held (``behaviour``);
- every minibatch's rollout-correction weights (``update.correction_weights``) are saved with the
  trainer's and the rollout's log-probs and the mask they were computed from
  (``<output_dir>/record/weights-rank-<r>.pt``, a list over the run);
- with ``MARLHF_RECORD_KILL_AT_STEP=N`` the process kills itself (SIGKILL) right after saving the
  step-N checkpoint;
- with ``MARLHF_RECORD_FAIL_AT_SYNC=N`` the N-th weight sync after an update raises an error of the
  package (a ``VLLMError``, as a bad input would), so that the run stops on purpose mid-training.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

import marlhf.stages.ppo.loop as loop
import marlhf.stages.ppo.main as stage
import marlhf.stages.ppo.multiturn as multiturn
import marlhf.stages.ppo.update as update
from marlhf.models.sequences import action_offsets
from marlhf.models.vllm_engine import VLLMError
from marlhf.runtime.distributed import rank
from marlhf.stages.exits import run_program
from marlhf.stages.ppo import sampler as rollout_sampler
from marlhf.stages.ppo.forward import policy_forward
from marlhf.stages.ppo.models import eval_mode

_setup, _generate, _score, _sync, _save = (
    loop.setup,
    loop.generate,
    loop.score,
    rollout_sampler.sync_weights,
    loop.save_checkpoint,
)
_play = multiturn.play
_weights = update.correction_weights
_state: dict = {
    "rollouts": [], "sampled_vs_scored": 0.0, "syncs": 0, "trainer": None, "behaviour": 0,
    "out": None,
    "weights": [],
}  # fmt: skip


def setup(cfg):
    _state["out"] = Path(cfg.log.output_dir) / "record"  # where the records go
    return _setup(cfg)


def generate(actor, sampler, batch, g, tokenizer, eos_ids, **kwargs):
    ro = _generate(actor, sampler, batch, g, tokenizer, eos_ids, **kwargs)
    _state["rollouts"].append(ro)
    return ro


def play(*args, **kwargs):
    ro, episodes = _play(*args, **kwargs)
    _state["rollouts"].append(ro)
    return ro, episodes


def score(models, ro, trainer, *args, **kwargs):
    out = _score(models, ro, trainer, *args, **kwargs)
    _state["trainer"] = trainer
    behaviour = out.rollout_logprobs is ro.logprobs and out.old_logprobs is out.trainer_logprobs
    _state["behaviour"] += int(ro.logprobs is not None and behaviour)
    if ro.logprobs is not None:  # the engine's record against the trainer's π_old
        diff = (ro.logprobs - out.old_logprobs).abs()[ro.action_mask]
        _state["sampled_vs_scored"] = max(_state["sampled_vs_scored"], float(diff.max()))
    return out


@torch.no_grad()
def _engine_vs_trainer(models, ro, temperature: float) -> float:
    with eval_mode(models.actor):
        trainer, _ = policy_forward(models.actor, ro, temperature)
    full = models.sampler.engine.token_logprobs(ro.sequences, ro.attention_mask.sum(1))
    start = ro.response_start.cpu()
    j = action_offsets(start, ro.response_ids.shape[1], ro.action_positions)
    at = (start[:, None] + j).clamp(max=full.shape[1] - 1)
    engine = full.gather(1, at).to(trainer.device)
    return float((engine - trainer).abs()[ro.action_mask].max())


TURN_FIELDS = ("sequences", "response_start", "response_ids", "action_mask", "action_positions",
               "turn_end", "turn_index", "turn_rewards")  # fmt: skip


def _turns(ro) -> dict[str, torch.Tensor]:
    """A multi-turn rollout's layout: the conversations and where their actions and rewards sit."""
    return {"prompt_ids": list(ro.prompt_ids), **{k: getattr(ro, k).cpu() for k in TURN_FIELDS}}


def sync_weights(models):
    if not _state["rollouts"]:  # the sync at the start of the run
        return _sync(models)
    ro, T = _state["rollouts"][-1], _state["trainer"].temperature
    before = _engine_vs_trainer(models, ro, T)
    _sync(models)
    after = _engine_vs_trainer(models, ro, T)
    _state["syncs"] += 1
    if str(_state["syncs"]) == os.environ.get("MARLHF_RECORD_FAIL_AT_SYNC"):
        raise VLLMError(f"a recorded failure at weight sync {_state['syncs']}")
    out = _state["out"]
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "before": before,
        "after": after,
        "sampled_vs_scored": _state["sampled_vs_scored"],
        "behaviour": _state["behaviour"],
        "responses": [r.response_ids.cpu() for r in _state["rollouts"]],
        "turns": [_turns(r) for r in _state["rollouts"] if r.action_positions is not None],
    }
    torch.save(record, out / f"sync-{_state['syncs']}-rank-{rank()}.pt")
    _state["rollouts"].clear()
    _state["sampled_vs_scored"] = 0.0
    _state["behaviour"] = 0


def correction_weights(exp, m, trainer):
    w = _weights(exp, m, trainer)
    trainer, rollout = exp.trainer_logprobs, exp.rollout_logprobs
    _state["weights"].append(
        {
            "weights": None if w is None else w.cpu(),
            "trainer": None if trainer is None else m.cut(trainer).cpu(),
            "rollout": None if rollout is None else m.cut(rollout).cpu(),
            "mask": m.rollout.action_mask.cpu(),
        }
    )
    out = _state["out"]
    out.mkdir(parents=True, exist_ok=True)
    torch.save(_state["weights"], out / f"weights-rank-{rank()}.pt")
    return w


def save_checkpoint(models, state, *args, **kwargs):
    _save(models, state, *args, **kwargs)
    if str(state.step) == os.environ.get("MARLHF_RECORD_KILL_AT_STEP"):
        os.kill(os.getpid(), signal.SIGKILL)


loop.setup, loop.generate, loop.score, loop.save_checkpoint = (
    setup,
    generate,
    score,
    save_checkpoint,
)
multiturn.play, multiturn.score = play, score
rollout_sampler.sync_weights = sync_weights
update.correction_weights = correction_weights

if __name__ == "__main__":
    run_program(lambda: stage.main(sys.argv[1:]))
