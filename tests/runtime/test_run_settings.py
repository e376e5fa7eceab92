"""A resume compares the run's settings with its checkpoint's (``marlhf.runtime.run_settings``): changes to
what is trained are refused with the list of differences unless ``--resume_with_changes`` (then
recorded in ``run_history.jsonl``), harmless ones pass, and a different number of processes that
changes the global batch is caught; a critic-free run resumed with ``gae`` says it has no critic."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from marlhf.cli import config_to_dict, flag_values, parse_config
from marlhf.runtime.run_settings import (
    HISTORY_FILE,
    SETTINGS_FILE,
    check_resume_settings,
    differences,
    settings,
)
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.sft.config import SFTConfig
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


def _record(**flags) -> dict:
    """A run's flags by name (:func:`marlhf.cli.flag_values`), ``flags`` changed."""
    base = {
        "learning_rate": 1e-3, "seed": 1, "per_device_train_batch_size": 4,
        "output_dir": "a", "log_interval": 1, "disable_progress_bar": False,
        "data_output_path": "c1", "max_seq_len": 128,
    }  # fmt: skip
    return {**base, **flags}


def test_differences_list_what_is_trained_and_ignore_the_harmless():
    old = settings(_record(), {"global_batch": 4})
    harmless = settings(
        _record(output_dir="b", log_interval=10, disable_progress_bar=True, data_output_path="c2"),
        {"global_batch": 4},
    )
    assert differences(old, harmless) == []
    # the same global batch from another split: 1 x 4 rows = 2 processes x 2 rows
    split = settings(_record(per_device_train_batch_size=2), {"global_batch": 4})
    assert differences(old, split) == []
    changed = settings(_record(learning_rate=2e-3, seed=9), {"global_batch": 8})
    assert differences(old, changed) == [
        ("--learning_rate", 1e-3, 2e-3),
        ("--seed", 1, 9),
        ("global_batch", 4, 8),
    ]
    # a flag one side does not know (another version) is not compared
    newer = settings({**_record(), "brand_new_flag": 3}, {"global_batch": 4})
    assert differences(old, newer) == []


def _checkpoint(root: Path, record: dict, step: int = 2) -> None:
    tag = root / "model" / f"step-{step}"
    tag.mkdir(parents=True)
    (tag / SETTINGS_FILE).write_text(json.dumps(record))
    (root / "latest.json").write_text(json.dumps({"tag": f"step-{step}", "step": step}))


def test_refused_without_the_flag_recorded_with_it(tmp_path):
    root = tmp_path / "train_state"
    _checkpoint(root, settings(_record(), {"global_batch": 4}))
    now = settings(_record(learning_rate=5e-4), {"global_batch": 2})
    with pytest.raises(ValueError) as err:
        check_resume_settings(root, "auto", False, now, tmp_path)
    text = str(err.value)
    assert text.startswith(f"resuming step-2 of {root} with settings that change what is trained")
    assert "--learning_rate 0.001 -> 0.0005" in text
    assert "the global batch (per-device batch x accumulation x processes) 4 -> 2" in text
    assert "--resume_with_changes" in text and "--resume never" in text
    assert not (tmp_path / HISTORY_FILE).exists()

    changes = check_resume_settings(root, "auto", True, now, tmp_path)
    assert [c[0] for c in changes] == ["--learning_rate", "global_batch"]
    (row,) = [json.loads(x) for x in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    assert row["resumed_from"] == str(root / "step-2")
    assert row["changes"][0] == {"setting": "--learning_rate", "checkpoint": 1e-3, "now": 5e-4}
    # nothing to compare: a fresh start, --resume never, a checkpoint saved without settings
    assert check_resume_settings(tmp_path / "none", "auto", False, now, tmp_path) == []
    assert check_resume_settings(root, "never", False, now, tmp_path) == []
    (root / "model" / "step-2" / SETTINGS_FILE).unlink()
    assert check_resume_settings(root, "auto", False, now, tmp_path) == []


def _flags(cls, *argv: str) -> dict:
    return flag_values(parse_config(cls, list(argv)))


@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        (["--dtype", "fp32"], ["--dtype", "bf16"], "--dtype fp32 -> bf16"),
        (["--dtype", "bf16"], ["--dtype", "fp32"], "--dtype bf16 -> fp32"),
        ([], ["--lora_dim", "4"], "--lora_dim 0 -> 4"),
        (["--lora_dim", "4"], ["--lora_dim", "8"], "--lora_dim 4 -> 8"),
        (["--lora_dim", "4"], ["--lora_dim", "4", "--lora_module_name", "mlp"],
         '--lora_module_name "layers." -> "mlp"'),
        (["--lora_dim", "4"], ["--lora_dim", "4", "--lora_train_base"],
         "--lora_train_base false -> true for the model's LoRA"),
        ([], ["--zero_stage", "2"], "--zero_stage 0 -> 2"),
        (["--zero_stage", "2"], ["--zero_stage", "3"], "--zero_stage 2 -> 3"),
    ],
)  # fmt: skip
def test_what_a_checkpoint_is_laid_out_for_cannot_change_even_with_changes(
    tmp_path, before, after, named
):
    """Precision, LoRA and the ZeRO stage (the layout of the engine state): refused with or without
    --resume_with_changes, saying so, nothing recorded."""
    root = tmp_path / "train_state"
    _checkpoint(root, settings(_flags(SFTConfig, *before), {"global_batch": 4}))
    now = settings(_flags(SFTConfig, *after), {"global_batch": 4})
    for accept in (False, True):
        with pytest.raises(ValueError) as err:
            check_resume_settings(root, "auto", accept, now, tmp_path)
        text = str(err.value)
        assert text.startswith(f"step-2 of {root}: these changes cannot be resumed, even with ")
        assert named in text and "start a new run from its model" in text
    assert not (tmp_path / HISTORY_FILE).exists()


def test_what_shares_a_layout_resumes_with_changes(tmp_path):
    """ZeRO 1 <-> 2, PPO's --bf16 for --dtype bf16, --lora_module_name without LoRA, and
    --only_optimize_lora with LoRA (the base is frozen either way) are no layout change."""
    pairs = [
        (_flags(SFTConfig, "--zero_stage", "1"), _flags(SFTConfig, "--zero_stage", "2")),
        (_flags(PPOStageConfig, "--bf16"), _flags(PPOStageConfig, "--dtype", "bf16")),
        (_flags(SFTConfig), _flags(SFTConfig, "--lora_module_name", "mlp")),
        (
            _flags(SFTConfig, "--lora_dim", "4"),
            _flags(SFTConfig, "--lora_dim", "4", "--only_optimize_lora"),
        ),
    ]
    for i, (old, new) in enumerate(pairs):
        root = tmp_path / f"train_state{i}"
        _checkpoint(root, settings(old, {"global_batch": 4}))
        check_resume_settings(root, "auto", True, settings(new, {"global_batch": 4}), tmp_path)
    # a checkpoint saved before --lora_train_base: without --only_optimize_lora its base trained
    old = {**_flags(SFTConfig, "--lora_dim", "4"), "only_optimize_lora": False}
    del old["lora_train_base"]
    _checkpoint(tmp_path / "old", settings(old, {}))
    with pytest.raises(ValueError, match="--lora_train_base true -> false"):
        now = settings(_flags(SFTConfig, "--lora_dim", "4"), {})
        check_resume_settings(tmp_path / "old", "auto", True, now, tmp_path)


# --- the stages ----------------------------------------------------------------------------------
def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(cmd: list[str], home: Path) -> subprocess.CompletedProcess:
    return run_python(
        cmd, env=stage_env(home), capture_output=True, text=True, cwd=ROOT, timeout=900
    )


def _errors(proc) -> list[str]:
    return [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("error:")]


@pytest.mark.slow
def test_sft_resume_with_other_settings(tmp_path):
    """A 4-step SFT run whose latest checkpoint is moved back to step 2, resumed: with another
    learning rate and seed (refused, listed), under two processes (the global batch doubles:
    refused), with another --log_interval and --output_dir-independent flags (passes), with
    --resume_with_changes (trains, records the changes), and in bf16 (refused even so)."""
    home, out = tmp_path / "home", tmp_path / "sft"
    sft = [sys.executable, "-m", "marlhf.stages.sft"]
    flags = ["--model_name_or_path", "tiny", "--max_samples", "40", "--max_steps", "4"]
    flags += ["--save_steps", "2", "--per_device_train_batch_size", "2", "--disable_progress_bar"]
    flags += ["--data_output_path", str(tmp_path / "cache"), "--output_dir", str(out)]
    first = _run([*sft, *flags], home)
    assert first.returncode == 0, first.stderr[-3000:]
    latest = out / "train_state" / "latest.json"
    saved = out / "train_state" / "model" / "step-4" / SETTINGS_FILE
    assert json.loads(saved.read_text())["derived"] == {"global_batch": 2}

    def back_to_step_2() -> None:
        latest.write_text(json.dumps({**json.loads(latest.read_text()), "tag": "step-2"}))

    back_to_step_2()
    refused = _run([*sft, *flags, "--learning_rate", "1e-3", "--seed", "7"], home)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = _errors(refused)
    assert "--learning_rate 5e-05 -> 0.001; --seed 1234 -> 7" in line
    assert "Traceback" not in refused.stderr

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    torchrun += ["--master_port", _port(), "-m", "marlhf.stages.sft"]
    two = _run([*torchrun, *flags], home)
    assert two.returncode != 0
    (line,) = _errors(two)
    assert "the global batch (per-device batch x accumulation x processes) 2 -> 4" in line

    harmless = _run([*sft, *flags, "--log_interval", "2", "--eval_iters", "1"], home)
    assert harmless.returncode == 0, harmless.stderr[-3000:]
    assert not (out / HISTORY_FILE).exists()

    back_to_step_2()
    accepted = _run([*sft, *flags, "--learning_rate", "1e-3", "--resume_with_changes"], home)
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert "resuming step-2" in accepted.stderr and "with changed settings" in accepted.stderr
    (row,) = [json.loads(x) for x in (out / HISTORY_FILE).read_text().splitlines()]
    assert row["changes"] == [{"setting": "--learning_rate", "checkpoint": 5e-05, "now": 0.001}]
    # the checkpoints after the change hold the new settings: the same command resumes cleanly
    assert json.loads(saved.read_text())["flags"]["learning_rate"] == 0.001

    # another precision: the engine state of an fp32 checkpoint holds no loss scale for bf16
    dtype = _run([*sft, *flags, "--dtype", "bf16", "--resume_with_changes"], home)
    assert dtype.returncode == 2, dtype.stderr[-3000:]
    (line,) = _errors(dtype)
    assert "these changes cannot be resumed" in line and "--dtype fp32 -> bf16" in line, line
    assert "dynamic_loss_scale" not in dtype.stderr and "Traceback" not in dtype.stderr


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny

    base = tmp_path_factory.mktemp("settings_ppo")
    actor = build_tiny(base / "actor")
    torch.manual_seed(0)
    rm = RewardModel.from_pretrained(actor)
    save_reward_model(
        rm, AutoTokenizer.from_pretrained(actor), base / "rm", score_stats={"mean": 0.0, "std": 1.0}
    )
    return base, actor, base / "rm"


@pytest.mark.slow
def test_ppo_estimator_changes_are_refused_and_a_critic_free_run_has_no_critic(rm_dir):
    base, actor, rm = rm_dir
    out = base / "grpo"
    ppo = [sys.executable, "-m", "marlhf.stages.ppo", "--actor_model_name_or_path", str(actor)]
    ppo += ["--reward_model_name_or_path", str(rm), "--n_samples_per_prompt", "2"]
    ppo += ["--max_prompt_seq_len", "160", "--max_answer_seq_len", "8", "--max_steps", "1"]
    ppo += ["--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2"]
    ppo += ["--data_output_path", str(base / "cache"), "--output_dir", str(out)]
    ppo += ["--disable_progress_bar"]
    done = _run([*ppo, "--advantage_estimator", "grpo"], base / "home")
    assert done.returncode == 0, done.stderr[-3000:]
    rloo = _run([*ppo, "--advantage_estimator", "rloo", "--ngram", "3"], base / "home")
    assert rloo.returncode == 2, rloo.stderr[-3000:]
    (line,) = _errors(rloo)
    assert '--advantage_estimator "grpo" -> "rloo"; --ngram 1 -> 3' in line
    shutil.rmtree(out / "actor")  # the models are not what a resume reads
    gae = [*ppo, "--advantage_estimator", "gae", "--critic_model_name_or_path", str(rm)]
    no_critic = _run([*gae, "--resume_with_changes"], base / "home")
    assert no_critic.returncode == 2, no_critic.stderr[-3000:]
    (line,) = _errors(no_critic)
    assert (
        "step-1: the run has no critic to resume (it was trained with --advantage_estimator" in line
    )
    assert (
        "grpo), and --advantage_estimator gae trains one" in line and "AssertionError" not in line
    )


def _flags_of(stage_cls, argv: list[str]) -> dict:
    return settings(flag_values(parse_config(stage_cls, argv)), {"global_batch": 4})


def test_a_config_file_and_the_tracker_flags_are_harmless_and_prefixed_flags_are_compared(
    tmp_path,
):
    """The settings are the parsed flags, by the names ``--help`` lists: a run resumed with its own
    ``run_config.json`` as ``--config`` (or the same values in a config file), another tracker or
    run name has nothing to report; a PPO flag of a composed part (``--actor_learning_rate``) and
    ``--apply_chat_template`` are compared under their flag names."""
    argv = ["--model_name_or_path", "tiny", "--learning_rate", "3e-4", "--output_dir", "out/a"]
    old = _flags_of(SFTConfig, argv)
    run_config = tmp_path / "run_config.json"
    run_config.write_text(json.dumps(config_to_dict(parse_config(SFTConfig, argv))))
    same_file = tmp_path / "flags.json"
    same_file.write_text(json.dumps({"model_name_or_path": "tiny", "learning-rate": 3e-4}))
    for now in (
        ["--config", str(run_config)],
        ["--config", str(same_file), "--output_dir", "out/b"],
        [*argv, "--report_to", "none", "--run_name", "another", "--tracker_project", "p2"],
    ):
        assert differences(old, _flags_of(SFTConfig, now)) == [], now
    changed = _flags_of(SFTConfig, [*argv, "--apply_chat_template"])
    assert differences(old, changed) == [("--apply_chat_template", False, True)]

    ppo = ["--actor_model_name_or_path", "tiny", "--actor_learning_rate", "1e-5"]
    ppo_old = _flags_of(PPOStageConfig, ppo)
    ppo_new = _flags_of(PPOStageConfig, [*ppo[:2], "--actor_learning_rate", "2e-5"])
    assert differences(ppo_old, ppo_new) == [("--actor_learning_rate", 1e-5, 2e-5)]
    assert {"actor_dropout", "critic_learning_rate", "critic_value_head"} <= set(ppo_old["flags"])
