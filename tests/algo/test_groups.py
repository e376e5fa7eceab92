"""--n_samples_per_prompt: the step's prompts, G rows each, numbered by global row; the estimator flags'
validation; groups estimated on the gathered batch equal the one-process groups."""

import doctest

import numpy as np
import pytest
import torch

import marlhf.algo.groups as groups
from marlhf.algo.groups import group_ids, group_stats
from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.prompts import plan_rollouts


def test_doctests():
    assert doctest.testmod(groups).failed == 0


def test_plan_counts_prompts_per_step_and_rejects_a_rollout_not_divisible_by_G():
    def cfg(G, gen_bs=4, batches=1):  # the generation and PPO parts of a stage config
        c = PPOStageConfig(
            generation=GenerationConfig(
                per_device_generation_batch_size=gen_bs, generation_batches=batches
            ),
            ppo=PPOConfig(n_samples_per_prompt=G, per_device_training_batch_size=2),
        )
        return c.generation, c.ppo

    plan = plan_rollouts(100, *cfg(4, gen_bs=8))
    assert plan.samples_per_prompt == 4 and plan.steps_per_epoch == 50  # 2 prompts per step
    assert plan_rollouts(100, *cfg(1, gen_bs=8)).steps_per_epoch == 12
    with pytest.raises(ValueError, match="--n_samples_per_prompt 3"):
        plan_rollouts(100, *cfg(3, gen_bs=4, batches=2))
    with pytest.raises(ValueError, match="fewer than one rollout"):
        plan_rollouts(1, *cfg(4, gen_bs=8))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"advantage_estimator": "grpo"}, "--n_samples_per_prompt to 2 or more"),
        ({"advantage_estimator": "rloo", "n_samples_per_prompt": 1}, "--n_samples_per_prompt"),
        ({"advantage_estimator": "dr-grpo"}, "--n_samples_per_prompt"),
        ({"advantage_estimator": "ppo"}, "--advantage_estimator 'ppo' is not known"),
        ({"n_samples_per_prompt": 0}, "--n_samples_per_prompt must be >= 1"),
        (
            {"advantage_estimator": "dr_grpo", "n_samples_per_prompt": 2, "loss_agg_mode": "token-mean"},
            "--loss_agg_mode token-mean contradicts",
        ),
        ({"loss_agg_mode": "mean"}, "--loss_agg_mode must be one of"),
        ({"ratio_level": "group"}, "--ratio_level must be one of"),
        ({"advantage_estimator": "macro_mc", "gamma": 0.9}, "--gamma must be 1"),
        ({"mc_rollouts": 0}, "--mc_rollouts"),
        ({"mc_max_boundaries": -1}, "--mc_max_boundaries"),
        ({"kl_loss_coef": -0.1}, "--kl_loss_coef"),
        ({"kl_loss_type": "k4"}, "--kl_loss_type"),
        ({"advantage_estimator": "reinforce_pp", "critic_warmup_steps": 2}, "trains no critic"),
    ],
)  # fmt: skip
def test_estimator_flags_are_validated_naming_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(**kwargs)


def test_estimator_settings_resolve():
    assert PPOConfig().policy_loss_agg_mode == "token-mean" and PPOConfig().needs_critic
    dr = PPOConfig(advantage_estimator="dr-grpo", n_samples_per_prompt=2)
    assert dr.estimator == "dr_grpo" and dr.policy_loss_agg_mode == "seq-mean-token-sum-norm"
    assert not dr.needs_critic and not dr.needs_mc
    mc = PPOConfig(advantage_estimator="macro-mc", loss_agg_mode="seq-mean-token-mean")
    assert mc.needs_mc and mc.policy_loss_agg_mode == "seq-mean-token-mean"
    PPOConfig(advantage_estimator="gae", n_samples_per_prompt=4)  # PPO with G samples is fine


def test_a_critic_free_run_needs_the_reward_model_path_only_for_a_reward_model_reward():
    from marlhf.config import ModelConfig
    from marlhf.stages.ppo.config import ActorCriticConfig, TrainedModelConfig

    grpo = PPOConfig(advantage_estimator="grpo", n_samples_per_prompt=2)
    with pytest.raises(ValueError, match="--reward_model_name_or_path"):
        PPOStageConfig(ppo=grpo)
    PPOStageConfig(ppo=grpo, models=ActorCriticConfig(reward_model_name_or_path="rm"))
    PPOStageConfig(
        ppo=grpo,
        models=ActorCriticConfig(
            critic=TrainedModelConfig(model=ModelConfig(model_name_or_path="rm", dropout=0.0))
        ),
    )
    gold = PPOConfig(advantage_estimator="grpo", n_samples_per_prompt=2, reward_source="gold")
    PPOStageConfig(ppo=gold)


def test_the_cli_parses_the_new_flags():
    from marlhf.cli import parse_config

    cfg = parse_config(
        PPOStageConfig,
        [
            "--advantage_estimator", "macro_mc", "--n_samples_per_prompt", "2",
            "--mc_rollouts", "3", "--mc_max_boundaries", "5", "--ratio_level", "sequence",
            "--loss_agg_mode", "seq-mean-token-mean", "--kl_loss_coef", "0.01",
            "--kl_loss_type", "k2", "--reward_model_name_or_path", "rm",
        ],
    )  # fmt: skip
    p = cfg.ppo
    assert (p.estimator, p.n_samples_per_prompt, p.mc_rollouts, p.mc_max_boundaries) == (
        "macro_mc", 2, 3, 5,
    )  # fmt: skip
    assert (p.ratio_level, p.loss_agg_mode, p.kl_loss_coef, p.kl_loss_type) == (
        "sequence", "seq-mean-token-mean", 0.01, "k2",
    )  # fmt: skip
    with pytest.raises(SystemExit):  # argparse reports the ValueError naming the flag
        parse_config(PPOStageConfig, ["--advantage_estimator", "grpo"])


def test_group_stats_against_plain_python():
    outcome = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0, 4.0])
    ids = group_ids(6, 2)
    assert ids.tolist() == [0, 0, 1, 1, 2, 2]
    stats = group_stats(outcome, ids)
    stds = [np.std([1, 3], ddof=1), 0.0, np.std([0, 4], ddof=1)]
    assert stats["group/score_std"] == pytest.approx(sum(stds) / 3)
    assert stats["group/zero_std_frac"] == pytest.approx(1 / 3)
