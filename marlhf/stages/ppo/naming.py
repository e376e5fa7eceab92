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

from marlhf.macro.config import MacroConfig
from marlhf.macro.naming import describe
from marlhf.stages.ppo.config import ActorCriticConfig

_ESTIMATOR_NAMES = {
    "grpo": "GRPO",
    "dr_grpo": "Dr. GRPO",
    "rloo": "RLOO",
    "reinforce_pp": "REINFORCE++",
    "macro_mc": "MA-MC",
}


def token_level(macro: MacroConfig) -> bool:
    """Whether the rule makes every token its own macro action (``fixed`` with n = 1)."""
    return macro.termination_condition == "fixed" and macro.ngram == 1


def macro_label(macro: MacroConfig) -> str:
    """``n=5`` for fixed n-grams, else the rule's description (``entropy (tau=2)``...)."""
    if macro.termination_condition == "fixed":
        return f"n={macro.ngram}"
    return describe(macro)


def run_label(cfg) -> str:
    """``PPO`` (GAE over tokens), ``MA-PPO n=5`` (GAE over macro actions), ``GRPO``, ``RLOO``,
    ``Dr. GRPO``, ``REINFORCE++``, ``MA-MC`` (``macro_mc``); a critic-free estimator over macro
    actions carries the rule too (``GRPO, macro n=5``)."""
    name = cfg.ppo.estimator
    if name == "gae":
        return "PPO" if token_level(cfg.macro) else f"MA-PPO {macro_label(cfg.macro)}"
    label = _ESTIMATOR_NAMES.get(name, name)
    if name == "macro_mc" or token_level(cfg.macro):
        return f"{label} {macro_label(cfg.macro)}" if name == "macro_mc" else label
    return f"{label}, macro {macro_label(cfg.macro)}"


def _critic_free():
    """Doctest helper: models without a critic but with a reward model."""
    return ActorCriticConfig(reward_model_name_or_path="rm")
