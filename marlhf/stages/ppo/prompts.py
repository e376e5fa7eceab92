"""Stage 3's data: the PPO prompts, how each step walks them, and the SFT batches of the pretraining
mix (``--unsup_coef``).

Step ``s`` of epoch ``e`` takes, on each of ``world`` ranks, ``--generation_batches`` batches of
``--per_device_generation_batch_size`` prompts from the permutation seeded ``--seed + e``
(:mod:`marlhf.runtime.batching`): the data position is the step itself, so a resumed run needs no saved
sampler state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from marlhf.data.collate import SFTCollator
from marlhf.data.tokenize import build_prompt_dataset, build_sft_dataset
from marlhf.rewards.registry import unusable_prompts
from marlhf.runtime.batching import epoch_permutation, step_micro_batches, steps_per_epoch
from marlhf.runtime.distributed import rank, world_size
from marlhf.runtime.rows import derive_row_seeds, global_rows, step_prompt_indices

if TYPE_CHECKING:
    from marlhf.data.config import DataConfig
    from marlhf.stages.ppo.config import GenerationConfig, PPOConfig

log = logging.getLogger("marlhf.ppo")


@dataclass(frozen=True)
class RolloutPlan:
    """How the run walks its prompts: each step generates ``generation_batches`` batches of
    ``generation_batch`` prompts on each of ``world`` ranks; an epoch is ``steps_per_epoch`` such
    steps; the run is ``total`` steps and ``total_updates`` optimizer steps per trained model."""

    n_prompts: int
    generation_batch: int
    generation_batches: int
    world: int
    steps_per_epoch: int
    total: int
    total_updates: int
    samples_per_prompt: int = (
        1  # G: each prompt of a step is sampled G times (--n_samples_per_prompt)
    )

    @property
    def rollout_size(self) -> int:
        """Responses per step on each rank."""
        return self.generation_batch * self.generation_batches


def plan_rollouts(n_prompts: int, g: GenerationConfig, ppo: PPOConfig) -> RolloutPlan:
    """The plan for ``n_prompts`` prompts: ``--max_steps`` steps when given (the prompts are looped
    over as often as needed, each epoch in its own order), else ``--num_train_epochs`` epochs."""
    gen_bs, gen_batches, ws = g.per_device_generation_batch_size, g.generation_batches, world_size()
    rollout_size = gen_bs * gen_batches
    if rollout_size % ppo.per_device_training_batch_size:
        raise ValueError(
            f"rollout per device ({gen_bs} x {gen_batches}) must be a multiple of "
            f"--per_device_training_batch_size {ppo.per_device_training_batch_size}"
        )
    G = ppo.n_samples_per_prompt
    if rollout_size * ws % G:
        raise ValueError(
            f"the rollout of a step ({gen_bs} x {gen_batches} responses per device x {ws} ranks = "
            f"{rollout_size * ws}) must be a multiple of --n_samples_per_prompt {G}: change "
            "--per_device_generation_batch_size or --generation_batches"
        )
    spe = n_prompts // (rollout_size * ws // G)
    if spe == 0:
        raise ValueError(
            f"PPO split has {n_prompts} prompts, fewer than one rollout ({rollout_size} x {ws}"
            + (f" / {G} samples per prompt)" if G > 1 else ")")
        )
    total = ppo.optim.max_steps or spe * ppo.optim.num_train_epochs
    minibatches = rollout_size // ppo.per_device_training_batch_size
    total_updates = max(
        1, total * ppo.ppo_epochs * minibatches // ppo.optim.gradient_accumulation_steps
    )
    return RolloutPlan(
        n_prompts=n_prompts,
        generation_batch=gen_bs,
        generation_batches=gen_batches,
        world=ws,
        steps_per_epoch=spe,
        total=total,
        total_updates=total_updates,
        samples_per_prompt=G,
    )


def prompt_split(data: DataConfig, g: GenerationConfig, seed: int, tokenizer, split: str):
    """The PPO phase of ``split`` (``train`` or ``eval``), tokenised (``--max_prompt_seq_len``,
    ``--overlong_prompts``), and the number of over-long prompts dropped or truncated."""
    overlong = "drop" if g.overlong_prompts == "drop" else "truncate_left"
    return build_prompt_dataset(
        data, tokenizer, split, seed, g.max_prompt_seq_len, phase=3, overlong=overlong
    )


def load_prompts(data: DataConfig, g: GenerationConfig, seed: int, reward_source: str, tokenizer):
    """The PPO split's tokenised prompts (left-padded by the collator later), and the number of
    over-long prompts dropped or truncated. With a code reward (``reward_source``:
    ``--reward_source`` resolved), problems without usable test cases are left out (APPS has a
    few); a source that cannot score some prompts otherwise (``math`` without an answer column,
    ``reasoning-gym`` on other data) refuses the data."""
    prompts, dropped = prompt_split(data, g, seed, tokenizer, "train")
    drop, refusals = unusable_prompts(reward_source, prompts["meta"], prompts["prompt_id"])
    if refusals:
        raise ValueError("; ".join(refusals))
    if drop:  # the code reward's problems without tests
        log.warning(
            "%d of %d PPO prompts have no usable test cases for the code reward; left out",
            len(drop),
            len(prompts),
        )
        gone = set(drop)
        prompts = prompts.select([i for i in range(len(prompts)) if i not in gone])
    return prompts, dropped


def generation_batches(plan: RolloutPlan, seed: int, step: int, later_values=None):
    """Each of this rank's generation batches of step ``step`` (:func:`step_prompts`): its prompt
    indices, its rows' sampling seeds (stream 2, from the rows' global indices, so that the
    rollouts do not depend on the split over ranks) and the entries of ``later_values`` (rows of
    the step's concatenated rollout whose critic values the update computes) within it, as
    indices into the batch (None when ``later_values`` is None)."""
    bs = plan.generation_batch
    rows = global_rows(plan.rollout_size, bs, rank(), plan.world)
    offset = 0  # the batch's first row in the concatenated rollout
    for j, idx in enumerate(step_prompts(plan, seed, step)):
        seeds = derive_row_seeds(seed, step, rows[j * bs : j * bs + len(idx)], stream=2)
        later = None
        if later_values is not None:
            inside = (later_values >= offset) & (later_values < offset + len(idx))
            later = later_values[inside] - offset
        yield idx, seeds, later
        offset += len(idx)


def step_prompts(plan: RolloutPlan, seed: int, step: int) -> list[list[int]]:
    """This rank's generation batches of step ``step``: lists of prompt indices (each prompt G
    times with ``--n_samples_per_prompt G``, :func:`marlhf.runtime.rows.step_prompt_indices`)."""
    epoch, step_in_epoch = divmod(step, plan.steps_per_epoch)
    perm = epoch_permutation(plan.n_prompts, seed, epoch)
    if plan.samples_per_prompt > 1:
        return step_prompt_indices(
            perm,
            step_in_epoch,
            batch=plan.generation_batch,
            batches=plan.generation_batches,
            world=plan.world,
            rank=rank(),
            samples_per_prompt=plan.samples_per_prompt,
        )
    return step_micro_batches(
        perm, step_in_epoch, plan.generation_batch, plan.generation_batches, plan.world, rank()
    )


def prompt_metas(batch: dict, n: int) -> list[dict]:
    """The ``meta`` of each of a collated batch's ``n`` prompts (test cases for code rewards)."""
    return [json.loads(m) if isinstance(m, str) else (m or {}) for m in batch.get("meta", [{}] * n)]


def sft_batches(data: DataConfig, ppo: PPOConfig, tokenizer, skip: int):
    """Endless SFT micro-batches for the pretraining-mix loss (``--unsup_coef``), this rank's shard,
    from the ``skip``-th on (the batches a resumed run already consumed)."""
    data = replace(data, data_path=ppo.unsup_data_path or data.data_path)
    ds = build_sft_dataset(data, tokenizer, "train", ppo.optim.seed)
    collate = SFTCollator(tokenizer.pad_token_id)
    mb, ws = ppo.per_device_training_batch_size, world_size()
    spe = steps_per_epoch(len(ds), mb, 1, ws)
    if spe == 0:
        raise ValueError(f"--unsup_coef: the SFT data has {len(ds)} examples, fewer than one batch")
    i = skip
    while True:
        epoch, step = divmod(i, spe)
        perm = epoch_permutation(len(ds), ppo.optim.seed + 1, epoch)
        (idx,) = step_micro_batches(perm, step, mb, 1, ws, rank())
        yield collate([ds[j] for j in idx])
        i += 1
