"""PPO and the settings its models were trained with: an actor and a reward model trained with
``--apply_chat_template`` (their run_config.json records it) used by a PPO run without it stop the
run with one error line naming the models and the files (``--allow_settings_mismatch``: a warning
and the run goes on); preflight reports the same."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from marlhf.cli import config_to_dict, parse_config
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.reward.config import RewardStageConfig
from marlhf.stages.sft.config import SFTConfig
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """An SFT model and a reward model on it, both trained with --apply_chat_template (as far as
    their run_config.json tell)."""
    import torch
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("templated")
    actor = build_tiny(base / "sft")
    torch.manual_seed(0)
    save_reward_model(
        RewardModel.from_pretrained(actor), AutoTokenizer.from_pretrained(actor), base / "rm"
    )
    for path, cls in ((actor, SFTConfig), (base / "rm", RewardStageConfig)):
        cfg = config_to_dict(parse_config(cls, ["--apply_chat_template"]))
        (Path(path) / "run_config.json").write_text(json.dumps(cfg))
    return base, Path(actor), base / "rm"


def _flags(base: Path, actor: Path, rm: Path, *extra: str) -> list[str]:
    return [
        "--actor_model_name_or_path", str(actor), "--critic_model_name_or_path", str(rm),
        "--data_output_path", str(base / "cache"), "--max_prompt_seq_len", "160",
        "--max_answer_seq_len", "8", "--per_device_generation_batch_size", "2",
        "--per_device_training_batch_size", "2", "--max_steps", "1", "--disable_progress_bar",
        *extra,
    ]  # fmt: skip


def test_ppo_without_the_template_its_models_learned_is_refused(templated, tmp_path):
    base, actor, rm = templated
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "marlhf.stages.ppo", *_flags(base, actor, rm), "--output_dir"]
    run = run_python(
        [*cmd, str(out)], env=stage_env(base), capture_output=True, text=True, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    errors = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    assert run.returncode == 2, run.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    for flag, path in (("--actor_model_name_or_path", actor), ("--critic_model_name_or_path", rm)):
        assert (
            f"{flag} {path} was trained with --apply_chat_template on ({path}/run_config.json); "
            "this run has it off"
        ) in errors[0]
    assert "--allow_settings_mismatch" in errors[0]
    assert not (out / "metrics.jsonl").exists()


def test_preflight_reports_it_and_the_override_turns_it_into_a_warning(templated, capsys, caplog):
    from marlhf.pipeline.preflight import main
    from marlhf.stages.ppo.models import check_seen_settings

    base, actor, rm = templated
    assert main(["ppo", *_flags(base, actor, rm)]) == 2
    err = capsys.readouterr().err
    assert f"--critic_model_name_or_path {rm} was trained with --apply_chat_template on" in err
    assert main(["ppo", *_flags(base, actor, rm, "--apply_chat_template")]) == 0
    assert main(["ppo", *_flags(base, actor, rm, "--allow_settings_mismatch")]) == 0
    cfg = parse_config(PPOStageConfig, _flags(base, actor, rm, "--allow_settings_mismatch"))
    with caplog.at_level(logging.WARNING, logger="marlhf.ppo"):
        check_seen_settings(cfg.models, cfg.reward_source, cfg.data)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("training anyway" in w for w in warned), warned
    with pytest.raises(ValueError, match="--allow_settings_mismatch to train anyway"):
        cfg = parse_config(PPOStageConfig, _flags(base, actor, rm))
        check_seen_settings(cfg.models, cfg.reward_source, cfg.data)
