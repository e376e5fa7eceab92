"""What a stage-3 run is called in logs and trackers: the algorithm its flags select.

>>> from marlhf.stages.ppo.config import PPOConfig, PPOStageConfig
>>> from marlhf.macro.config import MacroConfig
>>> run_label(PPOStageConfig())
'PPO'
>>> run_label(PPOStageConfig(macro=MacroConfig(ngram=5)))
'MA-PPO n=5'
>>> run_label(PPOStageConfig(ppo=PPOConfig(advantage_estimator="grpo", n_samples_per_prompt=4),
...                          models=_critic_free()))
'GRPO'
"""

from __future__ import annotations

from marlhf.algo.registry import estimator_class
from marlhf.macro.config import MacroConfig
from marlhf.macro.rules import rule_class
from marlhf.stages.ppo.config import ActorCriticConfig


def token_level(macro: MacroConfig) -> bool:
    """Whether the rule makes every token its own macro action (``fixed`` with n = 1)."""
    return rule_class(macro.termination_condition).token_level(macro)


def macro_label(macro: MacroConfig) -> str:
    """The rule's short label: ``n=5`` for fixed n-grams, else its label (``entropy (tau=2)``...)."""
    return rule_class(macro.termination_condition).short_label(macro)


def run_label(cfg) -> str:
    """``PPO`` (GAE over tokens), ``MA-PPO n=5`` (GAE over macro actions), ``GRPO``, ``RLOO``,
    ``Dr. GRPO``, ``REINFORCE++``, ``MA-MC`` (``macro_mc``): the estimator's run label
    (:meth:`marlhf.algo.registry.Estimator.run_label`); a critic-free estimator over macro
    actions carries the rule too (``GRPO, macro n=5``); ``--macro_credit boundary`` adds
    ``, boundary credit``."""
    credit = ", boundary credit" if cfg.macro.macro_credit == "boundary" else ""
    est = estimator_class(cfg.ppo.advantage_estimator)
    return est.run_label(macro_label(cfg.macro), token_level(cfg.macro)) + credit


def _critic_free():
    """Doctest helper: models without a critic but with a reward model."""
    return ActorCriticConfig(reward_model_name_or_path="rm")
