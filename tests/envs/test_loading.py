"""``--env`` and its flags: the config part's validation, finding the class (registered id, file,
module) and the errors when it cannot be found, ``--env_config`` inline or from a file, and
skyrl-gym's own multi-turn GSM8K environment played by a fake policy (mechanics only)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from marlhf.cli import parse_config
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env, parse_env_config
from marlhf.envs.runner import run_episodes

FAKES = Path(__file__).resolve().parents[1] / "support" / "fake_envs.py"


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_turns": 0}, "--max_turns must be >= 1"),
        ({"max_total_seq_len": 1}, "--max_total_seq_len must be >= 2"),
        ({"env_timeout_s": -1.0}, "--env_timeout_s must be >= 0"),
        ({"env_timeout_s": float("inf")}, "--env_timeout_s must be >= 0"),
        ({"env_workers": 0}, "--env_workers must be >= 1"),
        ({"env_errors": "ignore"}, "--env_errors must be one of"),
        ({"env_config": "{}"}, "--env_config needs --env"),
        ({"env": "file.py:"}, "--env file.py:: write path/to/file.py:ClassName"),
        ({"env": " gsm8k"}, "--env must be an id or PATH:ClassName"),
    ],
)
def test_config_validation_names_the_flag(kwargs, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        EnvConfig(**kwargs)


def test_flags_are_generated_from_the_part():
    from dataclasses import dataclass, field

    @dataclass
    class Stage:
        env: EnvConfig = field(default_factory=EnvConfig)

    cfg = parse_config(
        Stage, ["--env", "gsm8k_multi_turn", "--max_turns", "3", "--env_errors", "zero_reward"]
    )
    assert (cfg.env.env, cfg.env.max_turns, cfg.env.env_errors) == (
        "gsm8k_multi_turn",
        3,
        "zero_reward",
    )


def test_a_registered_id_a_file_and_a_module():
    f = load_env("gsm8k_multi_turn")
    assert f.name == "gsm8k_multi_turn" and f.cls.__name__ == "GSM8kMultiTurnEnv"
    assert f.target == "skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv"
    f = load_env("marlhf-trail-4")
    assert f.kwargs == {"turns": 4} and f.cls.__name__ == "TrailEnv"
    f = load_env(f"{FAKES}:Scripted")
    assert f.name == "Scripted" and f.target == f"{FAKES}:Scripted"
    assert load_env(f"{FAKES}:Scripted").cls is f.cls  # the file is imported once
    f = load_env("tests.support.fake_envs:Scripted")
    assert f.name == "Scripted" and f.cls.__module__ == "tests.support.fake_envs"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            "gsm8k_multiturn",
            r"no environment registered with id 'gsm8k_multiturn'; did you mean gsm8k_multi_turn",
        ),
        ("marlhf-trail-3", r"did you mean marlhf-trail-\d, marlhf-trail-\d, marlhf-trail-\d\?"),
        (f"{FAKES}:Scriptd", r"fake_envs.py has no Scriptd; did you mean Scripted\?"),
        ("tests/support/nope.py:Env", r"no such file .*tests/support/nope.py"),
        ("tests.support.nope:Env", r"no module named 'tests.support.nope'"),
        (
            "tests.support.fake_envs:Scriptd",
            r"tests.support.fake_envs has no Scriptd; did you mean Scripted",
        ),
        ("tests.support.fake_envs:FAKES", None),
    ],
)
def test_a_spec_that_cannot_be_found_is_one_error_naming_it(spec, says):
    if says is None:  # a name that is no class
        with pytest.raises(ValueError, match=r"--env tests.support.fake_envs:FAKES"):
            load_env(spec)
        return
    with pytest.raises(ValueError) as info:
        load_env(spec)
    assert str(info.value).startswith(f"--env {spec}: ")
    assert len(str(info.value).splitlines()) == 1
    assert re.search(says, str(info.value))


def test_a_file_that_fails_to_import_and_a_class_that_is_no_env(tmp_path):
    bad = tmp_path / "bad_env.py"
    bad.write_text("import no_such_package_here\n")
    with pytest.raises(ValueError, match=r"importing .*bad_env.py failed: ModuleNotFoundError"):
        load_env(f"{bad}:Env")
    f = load_env(f"{FAKES}:NotAnEnv")
    with pytest.raises(ValueError, match=r"--env NotAnEnv: builds a NotAnEnv, not a skyrl_gym Env"):
        f.make({})


def test_env_config_inline_and_from_files(tmp_path):
    assert parse_env_config(None) == {}
    assert parse_env_config('{"db_path": "/x", "topk": 3}') == {"db_path": "/x", "topk": 3}
    (tmp_path / "c.json").write_text('{"a": {"b": 1}}')
    assert parse_env_config(str(tmp_path / "c.json")) == {"a": {"b": 1}}
    (tmp_path / "c.yaml").write_text("a:\n  b: 1\nstep_reward: 0.1\n")
    assert parse_env_config(str(tmp_path / "c.yaml")) == {"a": {"b": 1}, "step_reward": 0.1}
    (tmp_path / "twice.yaml").write_text("a: 1\na: 2\n")
    with pytest.raises(ValueError, match=r"--env_config .*twice.yaml line 2: a is given twice"):
        parse_env_config(str(tmp_path / "twice.yaml"))
    with pytest.raises(ValueError, match=r"--env_config: not a valid JSON object"):
        parse_env_config("{db_path: 1}")
    with pytest.raises(ValueError, match=r"--env_config cfg.txt: give a JSON object"):
        parse_env_config("cfg.txt")
    with pytest.raises(ValueError, match=r"--env_config .*missing.json: No such file"):
        parse_env_config(str(tmp_path / "missing.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"must hold a mapping of names to values"):
        parse_env_config(str(tmp_path / "list.json"))


def test_env_config_reaches_the_environment_as_skyrl_passes_it():
    """SkyRL's environments read their config by attribute (``env_config.db_path``)."""
    f = load_env(f"{FAKES}:Scripted", '{"log_dir": null, "db_path": "/data/x.db"}')
    env = f.make({"id": "r"})
    assert env.log is None
    assert f.env_config == {"log_dir": None, "db_path": "/data/x.db"}


def test_skyrl_gym_gsm8k_multi_turn_with_a_fake_policy():
    """skyrl-gym's own environment, unchanged: rewards 0.2 / max_turns for a well-formed wrong
    answer and 1 for the right one (its compute_score), done on the right answer or at its
    max_turns (our --max_turns, passed in extras as SkyRL does)."""
    f = load_env("gsm8k_multi_turn")
    rows = [
        {"prompt": [{"role": "user", "content": "6 * 7?"}], "env_class": "gsm8k_multi_turn",
         "reward_spec": {"method": "rule", "ground_truth": "42"}, "extra_info": {}},
        {"prompt": [{"role": "user", "content": "2 + 2?"}], "env_class": "gsm8k_multi_turn",
         "reward_spec": {"method": "rule", "ground_truth": "4"}, "extra_info": {}},
    ]  # fmt: skip
    answers = {0: ["#### 41", "#### 42"], 1: ["no idea", "#### 5", "#### 6"]}

    def act(ids, conversations):
        return [
            answers[i][sum(m["role"] == "assistant" for m in c)]
            for i, c in zip(ids, conversations, strict=True)
        ]

    cfg = EnvConfig(env="gsm8k_multi_turn", max_turns=3, env_timeout_s=0)
    first, second = run_episodes(f, rows, act, cfg)
    assert first.rewards == [pytest.approx(0.2 / 3), 1.0] and first.stop == "done"
    assert "tentative numeric answer" in first.turns[0].observations[0]["content"]
    assert second.rewards == [0.0, pytest.approx(0.2 / 3), pytest.approx(0.2 / 3)]
    assert second.stop == "done" and second.turns[-1].observations == []
    assert second.turns[1].observations[0]["content"].startswith("Now provide only the final")
    assert second.metrics == {"steps": 3}
    assert json.dumps(second.messages)  # the conversation is plain JSON
