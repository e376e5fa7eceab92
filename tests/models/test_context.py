"""Sequence lengths against the model's context (``marlhf.models.context``): read from the config
(``n_positions`` of GPT-2, ``max_position_embeddings`` of Llama/Gemma, a multimodal model's
``text_config``), checked by preflight and by the stages, the message naming the flags and the
model."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

import marlhf.models.context as model_context
from marlhf.models.context import context_problem
from marlhf.pipeline.preflight import main as preflight_main
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


def test_doctests():
    assert doctest.testmod(model_context).failed == 0


def _model_dir(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_gpt2_and_llama_limits_name_both_flags(tmp_path):
    gpt2 = _model_dir(tmp_path / "gpt2", {"model_type": "gpt2", "n_positions": 96, "n_ctx": 96})
    llama = _model_dir(tmp_path / "llama", {"model_type": "llama", "max_position_embeddings": 512})
    lengths = {"--max_prompt_seq_len": 64, "--max_answer_seq_len": 120}
    assert context_problem({"--actor_model_name_or_path": str(gpt2)}, lengths) == (
        f"--max_prompt_seq_len 64 + --max_answer_seq_len 120 = 184 positions, more than "
        f"--actor_model_name_or_path {gpt2} takes (n_positions 96 in its config.json): lower "
        "them so that they add up to 96 or less"
    )
    assert context_problem({"--actor_model_name_or_path": str(gpt2)}, {"--max_prompt_seq_len": 64,
                           "--max_answer_seq_len": 32}) is None  # fmt: skip
    problem = context_problem({"--model_name_or_path": str(llama)}, {"--max_seq_len": 1000})
    assert problem.startswith(
        f"--max_seq_len 1000 positions, more than --model_name_or_path {llama}"
    )
    assert "(max_position_embeddings 512 in its config.json): lower it to 512 or less" in problem
    # the critic (another model of the run) is checked too; an unknown model is not
    models = {"--actor_model_name_or_path": str(llama), "--critic_model_name_or_path": str(gpt2)}
    assert "--critic_model_name_or_path" in context_problem(models, lengths)
    assert (
        context_problem({"--model_name_or_path": "no/such-model"}, {"--max_seq_len": 10**6}) is None
    )


def test_preflight_refuses_what_does_not_fit(capsys):
    argv = ["ppo", "--actor_model_name_or_path", "tiny-base", "--advantage_estimator", "grpo"]
    argv += ["--n_samples_per_prompt", "2", "--reward_source", "gold"]
    assert (
        preflight_main([*argv, "--max_prompt_seq_len", "400", "--max_answer_seq_len", "200"]) == 2
    )
    err = capsys.readouterr().err
    assert "--max_prompt_seq_len 400 + --max_answer_seq_len 200 = 600 positions, more than " in err
    assert "--actor_model_name_or_path tiny-base takes (max_position_embeddings 512" in err
    assert preflight_main(["sft", "--model_name_or_path", "tiny", "--max_seq_len", "513"]) == 2
    assert "--max_seq_len 513 positions, more than --model_name_or_path tiny takes" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["marlhf.stages.sft", "--model_name_or_path", "tiny-base", "--max_seq_len", "1000"],
        [
            "marlhf.stages.ppo",
            "--actor_model_name_or_path",
            "tiny-base",
            "--reward_source",
            "gold",
            "--max_prompt_seq_len",
            "400",
            "--max_answer_seq_len",
            "200",
        ],
    ],  # fmt: skip
    ids=["sft", "ppo"],
)
def test_the_stages_refuse_before_loading_anything(argv, tmp_path):
    cmd = [sys.executable, "-m", *argv, "--output_dir", str(tmp_path / "out")]
    cmd += ["--data_output_path", str(tmp_path / "cache")]
    run = subprocess.run(
        cmd, env=stage_env(tmp_path / "home"), capture_output=True, text=True, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-3000:]
    errors = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "(max_position_embeddings 512 in its config.json)" in errors[0]
    assert "Traceback" not in run.stderr and "IndexError" not in run.stderr
    assert not (tmp_path / "cache").exists()  # refused before the data were built
