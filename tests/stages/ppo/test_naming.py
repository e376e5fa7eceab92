"""Run names of stage 3 (marlhf/stages/ppo/naming.py): what the flags select, not always "MA-PPO"."""

import doctest

import pytest

import marlhf.stages.ppo.naming as naming
from marlhf.macro.config import MacroConfig
from marlhf.stages.ppo.config import ActorCriticConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.naming import run_label


def test_doctests():
    assert doctest.testmod(naming).failed == 0


@pytest.mark.parametrize(
    ("estimator", "macro", "label"),
    [
        ("gae", MacroConfig(), "PPO"),
        ("gae", MacroConfig(ngram=5), "MA-PPO n=5"),
        ("gae", MacroConfig(termination_condition="entropy"), "MA-PPO entropy (tau=2)"),
        ("grpo", MacroConfig(), "GRPO"),
        ("rloo", MacroConfig(), "RLOO"),
        ("dr_grpo", MacroConfig(), "Dr. GRPO"),
        ("reinforce_pp", MacroConfig(), "REINFORCE++"),
        ("grpo", MacroConfig(ngram=3), "GRPO, macro n=3"),
        ("macro_mc", MacroConfig(ngram=5), "MA-MC n=5"),
        (
            "gae",
            MacroConfig(termination_condition="lowprob", target_macro_len=4, lowprob_cut="before"),
            "MA-PPO lowprob (target length 4, cut before)",
        ),
        ("gae", MacroConfig(ngram=10, macro_credit="boundary"), "MA-PPO n=10, boundary credit"),
        (
            "macro_mc",
            MacroConfig(termination_condition="lowprob", macro_credit="boundary"),
            "MA-MC lowprob (p<0.5), boundary credit",
        ),
    ],
)
def test_labels(estimator, macro, label):
    g = 1 if estimator in ("gae", "reinforce_pp", "macro_mc") else 4
    cfg = PPOStageConfig(
        models=ActorCriticConfig(reward_model_name_or_path="rm"),
        ppo=PPOConfig(advantage_estimator=estimator, n_samples_per_prompt=g),
        macro=macro,
    )
    assert run_label(cfg.ppo, cfg.macro) == label
