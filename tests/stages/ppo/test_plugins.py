"""A termination rule and an advantage estimator of the user's, in one file outside the package
(``--plugin``), train in the real stage: the macro actions the rule implies and the advantages the
estimator gives show in the metrics, its label in the run's name, its validation in the errors, and
the saved configuration reloads with them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from marlhf.runtime.tracking import read_metrics
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow

# the whole file a user writes: a rule (the whole response is one macro action) and an estimator
# (no advantage at all), each with what the package asks of it
PLUGIN = '''
import torch

from marlhf.algo.estimators import Estimator, register_estimator
from marlhf.macro.rules import Rule, register_rule
from marlhf.macro.termination import TerminationOutput


@register_rule("whole")
class Whole(Rule):
    """The whole response is one macro action."""

    description = "the whole response"
    flags = ("eos_own_macro",)

    @classmethod
    def validate(cls, cfg):
        if cfg.eos_own_macro:
            raise ValueError("--termination_condition whole: pass --no_eos_own_macro")

    @classmethod
    def label(cls, cfg):
        return "whole response"

    def __call__(self, inputs):
        return TerminationOutput(macro_end=torch.zeros_like(inputs.action_mask))


@register_estimator("zero")
class Zero(Estimator):
    """Advantage 0 on every token."""

    label = "ZERO"
    description = "no advantage"
    min_group_size = 2

    def __call__(self, inputs):
        return torch.zeros_like(inputs.kl_rewards), None
'''


def _run(base: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo",
        "--actor_model_name_or_path", str(base / "actor"),
        "--reward_source", "gold",
        "--data_output_path", str(base / "cache"),
        "--max_prompt_seq_len", "160", "--max_answer_seq_len", "12",
        "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
        "--disable_progress_bar", *flags,
    ]  # fmt: skip
    return run_python(
        cmd, env=stage_env(base), capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_a_plugin_rule_and_estimator_train_and_reload(tmp_path):
    from marlhf.models.zoo import build_tiny

    build_tiny(tmp_path / "actor")
    plugin = tmp_path / "elsewhere" / "my_algorithms.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    out = tmp_path / "run"
    flags = ("--advantage_estimator", "zero", "--termination_condition", "whole")
    proc = _run(tmp_path, *flags, "--no_eos_own_macro", "--n_samples_per_prompt", "2",
                "--max_steps", "2", "--output_dir", str(out), "--plugin", str(plugin))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        # one macro action per response: as many as responses, each as long as its response
        assert row["macro/count"] == 1.0
        assert row["macro/mean_len"] == pytest.approx(row["response/length"], rel=1e-12)
        assert row["loss/policy"] == 0.0  # no advantage, no KL loss: a zero policy loss
        assert "loss/value" not in row  # the estimator reads no critic
    run = json.loads((out / "run_config.json").read_text())
    assert run["macro"]["plugin"] == [str(plugin)]
    assert (run["macro"]["termination_condition"], run["ppo"]["advantage_estimator"]) == (
        "whole",
        "zero",
    )
    assert "ZERO, macro whole response actor saved to" in proc.stderr + proc.stdout
    # the saved configuration names its plugin: fresh processes read it back (marlhf view's
    # trained rule of a policy, marlhf compare's run names)
    code = (
        "import json, sys\n"
        "from marlhf.inference.macro_rule import describe, trained_macro\n"
        "print(describe(trained_macro(sys.argv[1])[0]))\n"
        "from marlhf.cli import config_from_dict\n"
        "from marlhf.stages.ppo.config import PPOStageConfig\n"
        "from marlhf.stages.ppo.naming import run_label\n"
        "cfg = config_from_dict(PPOStageConfig, json.load(open(sys.argv[2])))\n"
        "print(run_label(cfg.ppo, cfg.macro))\n"
    )
    again = run_python(
        [sys.executable, "-c", code, str(out), str(out / "run_config.json")],
        env=stage_env(tmp_path),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == ["whole response", "ZERO, macro whole response"]
    # the plugin's constraints are checked before anything runs: one line naming the flag
    for extra, message in (
        (("--n_samples_per_prompt", "1", "--no_eos_own_macro"), "--n_samples_per_prompt to 2"),
        (("--n_samples_per_prompt", "2"), "--termination_condition whole: pass --no_eos_own_macro"),
    ):
        bad = _run(tmp_path, *flags, *extra, "--output_dir", str(tmp_path / "bad"), "--plugin",
                   str(plugin))  # fmt: skip
        assert bad.returncode == 2, bad.stderr[-3000:]
        assert message in bad.stderr and "Traceback" not in bad.stderr
        assert not (tmp_path / "bad").exists()
