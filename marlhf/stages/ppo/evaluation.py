"""Held-out evaluation of the PPO policy (``--eval_interval N``, ``--eval_iters K``).

Every N PPO steps and after the last, the actor answers the held-out prompts: the PPO phase of the
eval split (``--data_split`` divides each split between the three stages), the first ``K`` batches
of ``--per_device_generation_batch_size`` prompts per rank (0: all of them), sampled like the
rollouts (temperature, top-k, top-p). Logged under ``eval/``, averaged over the prompts:

- ``eval/reward``: the reward the run trains on (the reward model's score, normalised with
  ``--normalize_reward``; the gold score with ``--reward_source gold``; the execution reward with
  a code reward), before clipping and without the KL term;
- ``eval/score``: the reward model's raw score (with a reward model);
- ``eval/gold``: the synthetic task's gold score (on its prompts);
- ``eval/response_len`` and ``eval/ends_with_eos``.

The prompts are sampled by the run's sampler, the rollouts' backend (:mod:`marlhf.stages.ppo.sampler`),
whichever it is. The samples do not disturb training: a backend that seeds rows (static, vllm)
seeds each held-out row from (``--seed``, step, row; its own stream), and the global random state
(which ``hf`` draws from) is restored after the evaluation, so a run with evaluations trains
exactly as one without.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from marlhf.models.sequences import end_index
from marlhf.runtime.batching import padded_eval_shard
from marlhf.runtime.distributed import all_reduce_sum, rank, world_size
from marlhf.runtime.rows import derive_row_seeds
from marlhf.stages.ppo.forward import reward_forward
from marlhf.stages.ppo.prompts import prompt_metas, prompt_split
from marlhf.stages.ppo.rollout import generate

if TYPE_CHECKING:
    from marlhf.config import LoggingConfig
    from marlhf.data.config import DataConfig
    from marlhf.stages.ppo.config import GenerationConfig, PerfConfig, PPOConfig
    from marlhf.stages.ppo.models import Models
    from marlhf.stages.ppo.scoring import SequenceReward


class Run(Protocol):
    """What an evaluation reads of the PPO loop's run (:class:`marlhf.stages.ppo.loop.Run`)."""

    ppo: PPOConfig  # --seed
    generation: GenerationConfig
    perf: PerfConfig
    log: LoggingConfig  # --eval_iters
    models: Models
    tokenizer: Any
    collate: Callable[[list], dict]  # left-pads a list of prompts
    eos_ids: list[int]
    reward: SequenceReward
    gold: Callable[[str, str], float] | None
    eval_prompts: Any  # the held-out prompts (a datasets.Dataset)


EVAL_STREAM = 3  # the seeding backends' stream of held-out rows (rollouts use 2)


def load_eval_prompts(data: DataConfig, g: GenerationConfig, seed: int, tokenizer):
    """The PPO phase of the eval split, tokenised like the training prompts."""
    return prompt_split(data, g, seed, tokenizer, "eval")[0]


def due(log: LoggingConfig, step: int, total: int) -> bool:
    """Whether step ``step`` (1-based, just taken) is followed by an evaluation."""
    n = log.eval_interval
    return n > 0 and (step % n == 0 or step == total)


@torch.no_grad()
def evaluate_policy(run: Run, step: int) -> dict[str, float]:
    """The ``eval/*`` metrics of the actor after ``step`` steps (every rank calls it)."""
    prompts = run.eval_prompts
    bs = run.generation.per_device_generation_batch_size
    shard = padded_eval_shard(len(prompts), bs, world_size(), rank(), run.log.eval_iters)
    sums = torch.zeros(6, dtype=torch.float64)  # rows, reward, score, gold, length, eos
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):  # hf draws from the global RNG
        for idx, real in shard:
            out = _evaluate_batch(run, step, idx)
            if real:
                sums += out
    sums = all_reduce_sum(sums)
    n = max(float(sums[0]), 1.0)
    metrics = {"eval/reward": float(sums[1]) / n, "eval/response_len": float(sums[4]) / n}
    metrics["eval/ends_with_eos"] = float(sums[5]) / n
    if run.models.reward is not None:
        metrics["eval/score"] = float(sums[2]) / n
    if run.gold is not None:
        metrics["eval/gold"] = float(sums[3]) / n
    return metrics


def _evaluate_batch(run: Run, step: int, idx: list[int]) -> torch.Tensor:
    """Generate for the held-out prompts ``idx`` and score them: the sums of :func:`evaluate_policy`."""
    models = run.models
    batch = run.collate([run.eval_prompts[i] for i in idx])
    # the seeding backends' rows (the others draw from the global RNG, forked above)
    seeds = derive_row_seeds(run.ppo.optim.seed, step, torch.tensor(idx), stream=EVAL_STREAM)
    ro = generate(
        models.actor, models.sampler, batch, run.generation, run.tokenizer, run.eos_ids, seeds
    )
    texts = [run.eval_prompts[i]["prompt"] for i in idx]
    rm_scores = None
    if models.reward is not None:
        values = reward_forward(models.reward, ro, groups=run.perf.grouping)
        rm_scores = torch.gather(values, 1, end_index(ro.attention_mask).unsqueeze(1))[:, 0]
    rewards, _ = run.reward(ro, rm_scores, prompt_metas(batch, len(idx)), texts)
    gold = 0.0
    if run.gold is not None:
        answers = run.tokenizer.batch_decode(ro.response_ids, skip_special_tokens=True)
        gold = sum(run.gold(p, a) for p, a in zip(texts, answers, strict=True))
    return torch.tensor(
        [
            len(idx),
            float(rewards.sum()),
            float(rm_scores.sum()) if rm_scores is not None else 0.0,
            gold,
            float(ro.action_mask.sum()),
            float(ro.ends_with_eos.sum()),
        ],
        dtype=torch.float64,
    )
