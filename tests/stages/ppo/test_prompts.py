"""PPO's step plan: ``--max_steps`` wins over ``--num_train_epochs``, the prompts looped over as often
as needed, each pass a permutation of its own; without it, ``--num_train_epochs`` passes."""

from __future__ import annotations

from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, PPOStageConfig, ppo_optim
from marlhf.stages.ppo.prompts import plan_rollouts, step_prompts


def _cfg(**optim) -> tuple[GenerationConfig, PPOConfig]:
    """The generation and PPO parts of a stage config."""
    cfg = PPOStageConfig(
        generation=GenerationConfig(per_device_generation_batch_size=4),
        ppo=PPOConfig(per_device_training_batch_size=2, optim=ppo_optim(**optim)),
    )
    return cfg.generation, cfg.ppo


def test_max_steps_wins_over_the_epochs_and_loops_over_the_prompts():
    # 42 prompts in rollouts of 4: 10 steps per pass (2 prompts left over each pass)
    plan = plan_rollouts(42, *_cfg(max_steps=25, num_train_epochs=1))
    assert (plan.steps_per_epoch, plan.total) == (10, 25)
    # 2 minibatches of 2 per rollout, one PPO epoch: 2 optimizer steps per PPO step
    assert plan.total_updates == 50
    assert plan_rollouts(42, *_cfg(num_train_epochs=3)).total == 30
    assert plan_rollouts(42, *_cfg(max_steps=4, num_train_epochs=3)).total == 4

    steps = [sum(step_prompts(plan, 7, s), []) for s in range(plan.total)]
    passes = [sum(steps[p * 10 : (p + 1) * 10], []) for p in range(2)]
    for seen in passes:  # each full pass: 40 distinct prompts, none twice
        assert len(seen) == len(set(seen)) == 40 and set(seen) <= set(range(42))
    assert passes[0] != passes[1]  # in a new order
    assert len(set(sum(steps[20:], []))) == 20  # the third pass, cut at --max_steps
