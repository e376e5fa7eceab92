"""The flags of a multi-turn PPO run (``--env``, :class:`marlhf.envs.config.EnvConfig`) against the
rest of stage 3's: what a multi-turn rollout supports, refused in one line naming the flags
otherwise. No torch (the configuration calls it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from marlhf.algo.registry import estimator_class
from marlhf.data.env_rows import env_rows_problem
from marlhf.rewards.registry import source_names

if TYPE_CHECKING:
    from collections.abc import Sequence

    from marlhf.envs.config import EnvConfig

# the sequence-level reward sources a conversation can have besides the environment's rewards:
# the reward model reads the whole conversation (its score at the last action token); the others
# read one response's text
ENV_REWARD_SOURCES = ("rm",)


def check_env_flags(
    env: EnvConfig,
    *,
    termination_condition: str,
    advantage_estimator: str,
    data_path: Sequence[str],
    dense_reward: bool,
    custom_reward: bool,
    reward_source: str,
    reward_source_flag: str,
    eval_interval: int,
    unsup_coef: float,
    unsup_data_path: Sequence[str],
    generation_backend: str,
    max_prompt_seq_len: int,
) -> None:
    """ValueError naming the flags for a combination a multi-turn run does not support; without
    ``--env``, for the rule and the estimators that read turns (``--termination_condition turn``,
    an estimator with ``needs_turns``). ``reward_source``: ``--reward_source`` resolved (the stage
    config's ``reward_source``), ``reward_source_flag``: as given; the rest are the flags of the
    same names (``custom_reward``: ``--reward_fn`` or ``--reward_url`` given)."""
    estimator = estimator_class(advantage_estimator)
    if env.env is None:
        if termination_condition == "turn":
            raise ValueError(
                "--termination_condition turn makes each turn of a multi-turn conversation a "
                "macro action: it needs --env"
            )
        if estimator.needs_turns:
            raise ValueError(
                f"--advantage_estimator {estimator.name} reads the turns of multi-turn "
                "conversations: it needs --env"
            )
        return
    flag = f"--env {env.env}"
    for spec in data_path:
        problem = env_rows_problem(spec)
        if problem:
            raise ValueError(problem)
    if dense_reward:
        raise ValueError(
            f"--dense_reward with {flag}: the environment's per-turn rewards are the dense "
            "rewards of a conversation; a segment reward model's are not supported"
        )
    if custom_reward:
        raise ValueError(
            f"--reward_fn / --reward_url with {flag}: the environment gives the reward "
            "(--reward_source rm adds the reward model's score of the whole conversation)"
        )
    other = [n for n in source_names(reward_source) if n not in ENV_REWARD_SOURCES]
    if other:
        raise ValueError(
            f"--reward_source {reward_source_flag} with {flag}: {', '.join(other)} scores one "
            "response's text; a conversation's reward is the environment's (plus the reward "
            "model's score with --reward_source rm; leave --reward_source out for the "
            "environment's alone)"
        )
    if eval_interval > 0:
        raise ValueError(
            f"--eval_interval with {flag}: held-out episodes are not evaluated during training "
            "(leave it at 0)"
        )
    if unsup_coef > 0 and not unsup_data_path:
        raise ValueError(
            f"--unsup_coef with {flag}: --data_path holds prompt rows, not SFT data: name the "
            "SFT data with --unsup_data_path"
        )
    if generation_backend == "vllm" and max_prompt_seq_len < env.max_total_seq_len:
        raise ValueError(
            f"--generation_backend vllm with {flag}: each turn's prompt is the conversation so "
            f"far, up to --max_total_seq_len {env.max_total_seq_len} tokens; the engine holds "
            f"--max_prompt_seq_len ({max_prompt_seq_len}) + --max_answer_seq_len: raise "
            "--max_prompt_seq_len to --max_total_seq_len"
        )
