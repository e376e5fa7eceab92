"""The flags of a multi-turn PPO run (``--env``): composed into stage 3's config, and each
combination it does not support refused in one line naming the flags."""

from __future__ import annotations

import re

import pytest

from marlhf.cli import parse_config
from marlhf.stages.ppo.config import PPOStageConfig

ENV = ["--env", "marlhf-trail-2", "--data_path", "marlhf-trail-2:8"]


def test_the_env_flags_are_stage_3_flags_and_its_reward_is_the_environments():
    cfg = parse_config(
        PPOStageConfig,
        [*ENV, "--max_turns", "3", "--max_total_seq_len", "200", "--env_errors", "zero_reward",
         "--env_config", '{"step_reward": 0.1}', "--termination_condition", "turn"],
    )  # fmt: skip
    e = cfg.env
    assert (e.env, e.max_turns, e.max_total_seq_len, e.env_errors) == (
        "marlhf-trail-2", 3, 200, "zero_reward",
    )  # fmt: skip
    assert e.env_config == '{"step_reward": 0.1}' and cfg.reward_source == "none"
    assert parse_config(PPOStageConfig, [*ENV, "--reward_source", "rm"]).reward_source == "rm"
    assert parse_config(PPOStageConfig, []).reward_source == "rm"  # without --env, as ever
    cfg = parse_config(PPOStageConfig, [*ENV, "--advantage_estimator", "mt_grpo",
                                        "--n_samples_per_prompt", "4"])  # fmt: skip
    assert cfg.ppo.estimator == "mt_grpo"
    # macro_mc continues from turn boundaries, replaying the environment (marlhf.stages.ppo.mc_env)
    cfg = parse_config(PPOStageConfig, [*ENV, "--advantage_estimator", "macro_mc"])
    assert cfg.ppo.estimator == "macro_mc" and cfg.env.env == "marlhf-trail-2"


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--termination_condition", "turn"], "--termination_condition turn .* needs --env"),
        (
            ["--advantage_estimator", "mt_grpo", "--n_samples_per_prompt", "2"],
            "--advantage_estimator mt_grpo reads the turns .* needs --env",
        ),
        ([*ENV, "--dense_reward"], "--dense_reward with --env marlhf-trail-2"),
        ([*ENV, "--reward_source", "gold"], "--reward_source gold with --env marlhf-trail-2: gold"),
        ([*ENV, "--reward_fn", "f.py:score"], "--reward_fn / --reward_url with --env"),
        (["--env", "marlhf-trail-2"], "--data_path synthetic-tldr: with --env, name prompt rows"),
        ([*ENV[:2], "--data_path", "marlhf-trail-3"], "the trail task has .2, 4, 8. turns"),
        ([*ENV, "--eval_interval", "5"], "--eval_interval with --env marlhf-trail-2"),
        ([*ENV, "--unsup_coef", "0.1"], "--unsup_coef with --env .* --unsup_data_path"),
        (
            [*ENV, "--generation_backend", "vllm", "--max_total_seq_len", "512"],
            "vllm with --env .* raise --max_prompt_seq_len to --max_total_seq_len",
        ),
    ],
)
def test_unsupported_combinations_are_one_line_naming_the_flags(flags, says, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_config(PPOStageConfig, flags)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    (line,) = [x for x in err if "error: " in x]  # one line, then the pointer to --help
    assert re.search(says, line), line
