"""Numbers on the command line: every float flag of every program is finite (``inf`` only where its
help documents it), and the flags with a range refuse values outside it, with one error line naming
the flag, before anything runs.

The flags are enumerated here from the config dataclasses themselves, by the rules of
``docs/CONVENTIONS.md`` (a part's fields are flags, a composed part adds its ``prefix`` and keeps
the fields its ``flags`` lists), not by the flag generator under test."""

from __future__ import annotations

import dataclasses
import doctest
import json
import math
import re
import types
import typing

import pytest

import marlhf.config
from marlhf.cli import parse_config
from marlhf.gpu_check import GPUCheckStageConfig
from marlhf.inference.run import InferenceArgs
from marlhf.inference.view import ViewArgs
from marlhf.judge.config import JudgeConfig
from marlhf.judge.human import HumanEvalStage
from marlhf.judge.run import JudgeStage
from marlhf.judge.sampling import SampleStage
from marlhf.macro.config import MacroConfig
from marlhf.pipeline.compare import CompareArgs
from marlhf.rewards.code import CodeRewardConfig
from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, PPOStageConfig
from marlhf.stages.reward.config import RewardStageConfig
from marlhf.stages.sft.config import SFTConfig

# every program built from a config, with the flags it requires
PROGRAMS = {
    "sft": (SFTConfig, []),
    "rm": (RewardStageConfig, []),
    "ppo": (PPOStageConfig, []),
    "infer": (InferenceArgs, []),
    "view": (ViewArgs, []),
    "compare": (CompareArgs, []),
    "judge": (JudgeStage, ["--model_name_a", "a", "--model_name_b", "b", "--output", "o"]),
    "human-eval": (HumanEvalStage, ["--model_name_a", "a", "--model_name_b", "b", "--output", "o"]),
    "sample": (SampleStage, ["--data_path", "d", "--save_path", "s"]),
    "gpu_check": (GPUCheckStageConfig, []),
}


def _float_flags(cls: type, prefix: str = "", only=None):
    """(flag, help) of every float (or float tuple, optional or not) field of config ``cls``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or (only is not None and f.name not in only):
            continue
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = args[0]
        if dataclasses.is_dataclass(tp):
            yield from _float_flags(
                tp, prefix + f.metadata.get("prefix", ""), f.metadata.get("flags")
            )
        elif tp is float or (typing.get_origin(tp) is tuple and typing.get_args(tp)[0] is float):
            yield f.metadata.get("flag") or f"--{prefix}{f.name}", str(f.metadata.get("help", ""))


CASES = [
    (program, flag, value, help_text)
    for program, (cls, _) in PROGRAMS.items()
    for flag, help_text in _float_flags(cls)
    for value in ("nan", "inf", "-inf")
]


def test_every_program_has_float_flags_to_check():
    programs = {c[0] for c in CASES}
    assert {"sft", "rm", "ppo", "infer", "judge"} <= programs
    assert len({(c[0], c[1]) for c in CASES}) > 40


@pytest.mark.parametrize(("program", "flag", "value", "help_text"), CASES)
def test_non_finite_numbers_are_refused_naming_the_flag(program, flag, value, help_text, capsys):
    cls, required = PROGRAMS[program]
    documented_inf = value == "inf" and re.search(r"\binf\b", help_text)
    if documented_inf:  # e.g. --entropy_threshold inf: one macro action
        cfg = parse_config(cls, [*required, f"{flag}={value}"])
        found = [v for v in _values(cfg) if isinstance(v, float) and math.isinf(v)]
        assert found == [math.inf]
        return
    with pytest.raises(SystemExit) as exc:
        parse_config(cls, [*required, f"{flag}={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert re.search(rf"error: {re.escape(flag)} must be .*, got {value}$", err[0]), err


def _values(cfg):
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        yield from _values(v) if dataclasses.is_dataclass(v) else [v]


# (program, flag, a value outside its range, the edge of the range, inside it)
RANGES = [
    ("sft", "--weight_decay", "-5", "0"),
    ("sft", "--learning_rate", "-1e-5", "0"),
    ("sft", "--dropout", "1", "0"),
    ("sft", "--lora_dropout", "1", "0"),
    ("sft", "--lora_alpha", "0", "0.5"),
    ("sft", "--adam_beta1", "1", "0"),
    ("sft", "--adam_beta2", "-0.1", "0.999"),
    ("sft", "--adam_eps", "-1e-8", "0"),
    ("sft", "--max_grad_norm", "-1", "0"),
    ("sft", "--warmup_ratio", "1", "0"),
    ("rm", "--center_rewards_coef", "-0.01", "0"),
    ("rm", "--lowprob_threshold", "0", "1"),
    ("rm", "--target_macro_len", "0.5", "1"),
    ("ppo", "--temperature", "0", "1e-3"),
    ("ppo", "--top_p", "0", "1"),
    ("ppo", "--top_p", "1.5", "0.5"),
    ("ppo", "--lam", "1.5", "1"),
    ("ppo", "--gamma", "-0.1", "0"),
    ("ppo", "--kl_ctl", "-0.1", "0"),
    ("ppo", "--target_kl", "0", "0.1"),
    ("ppo", "--kl_loss_coef", "-1", "0"),
    ("ppo", "--cliprange", "0", "0.1"),
    ("ppo", "--cliprange_value", "-0.2", "0.1"),
    ("ppo", "--reward_clip", "-1", "0"),
    ("ppo", "--rollout_is_cap", "1", "1.01"),
    ("ppo", "--ema_decay", "1", "0.5"),
    ("ppo", "--unsup_coef", "-1", "0"),
    ("ppo", "--actor_learning_rate", "-1e-6", "0"),
    ("ppo", "--critic_weight_decay", "-0.1", "0"),
    ("ppo", "--actor_dropout", "1", "0"),
    ("ppo", "--vllm_gpu_memory_utilization", "1", "0.5"),
    ("ppo", "--code_timeout_s", "0", "0.5"),
    ("ppo", "--length_group_call_tokens", "-1", "0"),
]


@pytest.mark.parametrize(("program", "flag", "bad", "good"), RANGES)
def test_numbers_outside_their_range_are_refused(program, flag, bad, good, capsys):
    cls, required = PROGRAMS[program]
    with pytest.raises(SystemExit) as exc:
        parse_config(cls, [*required, f"{flag}={bad}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()[0]
    assert f"error: {flag} must be " in err and err.endswith(f"got {float(bad)}"), err
    cfg = parse_config(cls, [*required, f"{flag}={good}"])
    assert float(good) in list(_values(cfg))


def test_a_config_file_number_is_checked_like_a_flag(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text('{"ppo": {"lam": NaN}}')  # JSON as Python writes float("nan")
    assert json.loads(path.read_text())["ppo"]["lam"] != 0.5
    with pytest.raises(SystemExit):
        parse_config(PPOStageConfig, ["--config", str(path)])
    assert "error: --lam must be a finite number in [0, 1], got nan" in capsys.readouterr().err


def test_a_config_built_in_python_is_checked_too():
    with pytest.raises(ValueError, match=r"--temperature must be a finite number > 0, got inf"):
        GenerationConfig(temperature=math.inf)
    with pytest.raises(ValueError, match=r"--weight_decay must be >= 0, got -5"):
        marlhf.config.OptimConfig(weight_decay=-5.0)
    with pytest.raises(ValueError, match=r"--lam must be in \[0, 1\], got 2"):
        PPOConfig(lam=2.0)


def test_help_shows_the_range(capsys):
    with pytest.raises(SystemExit):
        parse_config(PPOStageConfig, ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Nucleus sampling. Range (0, 1]." in text


# (program, a whole-number flag with a range, a value outside it, the error's condition)
WHOLE_NUMBER_RANGES = [
    ("judge", "--concurrency", "0", ">= 1"),
    ("judge", "--max_retries", "-1", ">= 0"),
    ("judge", "--limit", "0", ">= 1"),
    ("judge", "--bootstrap", "0", ">= 1"),
    ("ppo", "--ngram", "0", ">= 1"),
    ("ppo", "--repeat_times", "0", ">= 1"),
    ("ppo", "--parsing_cutoff", "0", ">= 1"),
    ("ppo", "--parse_workers", "-1", ">= 0"),
    ("ppo", "--ppl_min_len", "0", ">= 1"),
    ("ppo", "--ppl_max_len", "-1", ">= 0"),
    ("ppo", "--code_workers", "0", ">= 1"),
    ("ppo", "--code_memory_mb", "31", ">= 32"),
    ("ppo", "--code_max_tests", "0", ">= 1"),
]


@pytest.mark.parametrize(("program", "flag", "bad", "condition"), WHOLE_NUMBER_RANGES)
def test_whole_numbers_outside_their_range_are_refused(program, flag, bad, condition, capsys):
    cls, required = PROGRAMS[program]
    with pytest.raises(SystemExit) as exc:
        parse_config(cls, [*required, f"{flag}={bad}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()[0]
    assert err.endswith(f"error: {flag} must be {condition}, got {bad}"), err


@pytest.mark.parametrize(
    ("program", "shown"),
    [
        ("judge", "Requests in flight at most. Range [1, inf)."),
        ("judge", "Relative length difference of a length-matched pair. Range [0, 1)."),
        ("judge", "Per-request timeout in seconds. Range (0, inf)."),
        ("ppo", "Tokens per macro action for `fixed` (1 = token-level PPO). Range [1, inf)."),
        ("ppo", "Address-space limit per test (MiB). Range [32, inf)."),
    ],
)
def test_help_shows_the_range_of_judge_macro_and_code_flags(program, shown, capsys):
    with pytest.raises(SystemExit):
        parse_config(PROGRAMS[program][0], ["--help"])
    assert shown in " ".join(capsys.readouterr().out.split())


def test_judge_macro_and_code_configs_built_in_python_check_their_ranges():
    with pytest.raises(ValueError, match=r"^--concurrency must be >= 1, got 0$"):
        JudgeConfig(model_name_a="a", model_name_b="b", output="o", concurrency=0)
    with pytest.raises(ValueError, match=r"^--length_tolerance must be in \[0, 1\), got 1.0$"):
        JudgeConfig(model_name_a="a", model_name_b="b", output="o", length_tolerance=1.0)
    with pytest.raises(ValueError, match=r"^--ppl_max_len must be >= 0, got -1$"):
        MacroConfig(ppl_max_len=-1)
    with pytest.raises(ValueError, match=r"^--code_memory_mb must be >= 32, got 8$"):
        CodeRewardConfig(code_memory_mb=8)


def test_doctests():
    assert doctest.testmod(marlhf.config, raise_on_error=False).failed == 0
