"""``marlhf infer`` with a reward model trained with ``--apply_chat_template`` (its run_config.json
records it) but run without it: a warning naming the model and the file (the scores are of other
texts than the model learned on); none when the settings agree."""

from __future__ import annotations

import json
import logging
import shutil

from marlhf.cli import config_to_dict, parse_config
from marlhf.inference import run_inference
from marlhf.stages.reward.config import RewardStageConfig
from tests.support.inference import inference_args


def test_a_reward_model_trained_with_the_template_warns_without_it(assets, tmp_path, caplog):
    rm = tmp_path / "rm"
    shutil.copytree(assets["rm"], rm)
    cfg = config_to_dict(parse_config(RewardStageConfig, ["--apply_chat_template"]))
    (rm / "run_config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="marlhf.inference"):
        run_inference(inference_args(assets, tmp_path / "a", reward_model=str(rm), num_samples=2))
    warned = [r.getMessage() for r in caplog.records if "apply_chat_template" in r.getMessage()]
    assert warned == [
        f"--reward_model_name_or_path {rm} was trained with --apply_chat_template on "
        f"({rm}/run_config.json); this run has it off: the model sees other texts than it "
        "learned on"
    ]
    cfg["data"]["apply_chat_template"] = False
    (rm / "run_config.json").write_text(json.dumps(cfg))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marlhf.inference"):
        run_inference(inference_args(assets, tmp_path / "b", reward_model=str(rm), num_samples=2))
    assert not [r for r in caplog.records if "apply_chat_template" in r.getMessage()]
