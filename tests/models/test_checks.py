"""What a model was trained on (``marlhf.models.checks.settings_mismatches``): the data settings a
stage records in a model's ``run_config.json`` against those of the run that uses the model."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import marlhf.models.checks as checks
from marlhf.cli import config_to_dict, parse_config
from marlhf.models.checks import settings_mismatches
from marlhf.stages.reward.config import RewardStageConfig
from marlhf.stages.sft.config import SFTConfig


def trained_dir(root: Path, cls: type, *flags: str, eos: str = "</s>") -> str:
    """A model directory as a stage leaves it: its run_config.json (the stage's config parsed from
    ``flags``) and its tokenizer's config (eos ``eos``)."""
    root.mkdir(parents=True)
    run_config = config_to_dict(parse_config(cls, list(flags)))
    (root / "run_config.json").write_text(json.dumps(run_config))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}))
    return str(root)


def test_doctests():
    assert doctest.testmod(checks, raise_on_error=False).failed == 0


def test_a_chat_template_setting_other_than_the_models_is_named(tmp_path):
    sft = trained_dir(tmp_path / "sft", SFTConfig, "--apply_chat_template")
    rm = trained_dir(tmp_path / "rm", RewardStageConfig)
    models = {"--actor_model_name_or_path": sft, "--reference_model_name_or_path": sft}
    models |= {"--critic_model_name_or_path": rm, "--base": "tiny-base", "--none": None}
    assert settings_mismatches(models, {"apply_chat_template": False}) == [
        f"--actor_model_name_or_path {sft} was trained with --apply_chat_template on "
        f"({sft}/run_config.json); this run has it off"
    ]  # the reference (the same directory) once, the RM agrees, a base model records nothing
    assert settings_mismatches(models, {"apply_chat_template": True}) == [
        f"--critic_model_name_or_path {rm} was trained with --apply_chat_template off "
        f"({rm}/run_config.json); this run has it on"
    ]


def test_an_end_of_conversation_token_is_its_eos_when_not_given(tmp_path):
    plain = trained_dir(tmp_path / "plain", RewardStageConfig, eos="</s>")
    given = trained_dir(
        tmp_path / "given", RewardStageConfig, "--end_of_conversation_token", "<|end|>"
    )
    key = "end_of_conversation_token"
    assert settings_mismatches({"--rm": plain}, {key: "</s>"}) == []  # its eos, spelt out
    assert settings_mismatches({"--rm": plain}, {key: None}) == []
    assert settings_mismatches({"--rm": given}, {key: "<|end|>"}) == []
    assert settings_mismatches({"--rm": given}, {key: None}) == [
        f'--rm {given} was trained with --end_of_conversation_token "<|end|>" '
        f'({given}/run_config.json); this run has "</s>"'
    ]
