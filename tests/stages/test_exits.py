"""Every error a stage raises on purpose ends the process with one ``error:`` line and status 2
(bad input) or 1, with no traceback, under ``python -m``, ``torchrun`` and the ``deepspeed``
launcher (``marlhf.stages.exits``); ``MARLHF_TRACEBACK=1`` shows the traceback; a data error exits
2 every time (it could abort with status 134 when the process group outlived the error)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marlhf.stages.exits import error_line, exit_status, raised_on_purpose
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


def _caught(fn) -> BaseException:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("no error")


def test_raised_on_purpose_is_a_raise_statement_of_the_package():
    from marlhf.data.config import DataConfig
    from marlhf.data.tokenize import eot_ids
    from marlhf.models.load import resolve_model_path

    ours = [
        _caught(lambda: DataConfig(data_split="1,2")),
        _caught(lambda: resolve_model_path("./no/such/model")),
        _caught(lambda: eot_ids(DataConfig(end_of_conversation_token="two words"), _Tok())),
    ]
    for e in ours:
        assert raised_on_purpose(e), repr(e)
        assert exit_status(e) == 2
    theirs = [
        _caught(lambda: torch.cat([torch.zeros(2, 2), torch.zeros(3, 3)], dim=1)),
        _caught(lambda: int("x")),
        _caught(lambda: [].pop()),
    ]
    for e in theirs:
        assert not raised_on_purpose(e), repr(e)


class _Tok:
    """A tokenizer that splits every text into one piece per word."""

    eos_token, unk_token, unk_token_id, name_or_path = "<eos>", "<unk>", 0, "words"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(1, len(text.split()) + 1))}

    def convert_ids_to_tokens(self, ids):
        return [str(i) for i in ids]


def test_who_prints_what(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    bad_input = ValueError("--ngram must be >= 1\nsee --help")
    assert error_line(bad_input) == "error: --ngram must be >= 1; see --help"
    # two ranks on one node: rank 0 reports an input error (every rank raises it alike)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert error_line(bad_input) is None
    assert error_line(OSError("disk full")) == "error: rank 1: disk full"
    # the first rank of another node reports it too (a path missing on that node only)
    monkeypatch.setenv("RANK", "8")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert error_line(bad_input) == "error: --ngram must be >= 1; see --help"


# --- the stage under each launcher ---------------------------------------------------------------
def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


LAUNCHERS = {
    "python": lambda: [sys.executable],
    "torchrun": lambda: [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", _port(),
    ],
    "deepspeed": lambda: [
        sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
        "--master_port", _port(), "--module",
    ],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_samples_per_prompt_that_do_not_divide_the_rollout_is_one_line(launcher, tmp_path):
    """``--n_samples_per_prompt 3`` with rollouts of 4 (x ranks) responses: raised while planning
    the run, on every rank alike."""
    cmd = LAUNCHERS[launcher]()
    cmd += ([] if launcher == "deepspeed" else ["-m"]) + ["marlhf.stages.ppo"]
    cmd += ["--actor_model_name_or_path", "tiny", "--advantage_estimator", "grpo"]
    cmd += ["--reward_source", "gold", "--n_samples_per_prompt", "3"]
    cmd += ["--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2"]
    cmd += ["--data_output_path", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out")]
    run = run_python(
        cmd, env=stage_env(tmp_path / "home"), capture_output=True, text=True, cwd=ROOT,
        timeout=600,
    )  # fmt: skip
    text = run.stdout + run.stderr
    errors = [x for x in text.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, text[-4000:]
    assert "must be a multiple of --n_samples_per_prompt 3" in errors[0]
    assert "[rank0]" not in text and "[rank1]" not in text, text[-4000:]
    assert "marlhf/stages/ppo/prompts.py" not in text  # no traceback of the stage's
    if launcher == "python":
        assert run.returncode == 2 and "Traceback" not in text
        shown = run_python(
            cmd, env={**stage_env(tmp_path / "home"), "MARLHF_TRACEBACK": "1"},
            capture_output=True, text=True, cwd=ROOT, timeout=600,
        )  # fmt: skip
        assert shown.returncode != 0 and "Traceback" in shown.stderr
        assert "marlhf/stages/ppo/prompts.py" in shown.stderr
    elif launcher == "deepspeed":
        assert run.returncode == 2 and "Traceback" not in text
    else:
        assert run.returncode != 0


@pytest.mark.slow
def test_a_data_error_exits_2_every_time(tmp_path):
    """The SFT stage on a row whose ``chosen`` is empty, run repeatedly: one error line and status
    2 each time (an abort, status 134 "terminate called without an active exception", came in
    about one run of four when the process group was left alive at exit)."""
    data = tmp_path / "data"
    data.mkdir()
    good = '{"prompt": "Q: hello\\nA:", "chosen": " hi"}\n'
    (data / "train.jsonl").write_text(good * 6 + '{"prompt": "Q: x\\nA:", "chosen": ""}\n')
    (data / "eval.jsonl").write_text(good)
    cmd = [sys.executable, "-m", "marlhf.stages.sft", "--model_name_or_path", "tiny"]
    cmd += ["--data_path", str(data), "--data_split", "1,0,0", "--max_steps", "1"]
    cmd += ["--data_output_path", str(tmp_path / "cache")]
    env = stage_env(tmp_path / "home")
    want = f'error: {data / "train.jsonl"} line 7: field "chosen" is empty'
    statuses = []
    for round_ in range(2):  # two at a time: the runs overlap as on a busy node
        procs = [
            subprocess.Popen(
                [*cmd, "--output_dir", str(tmp_path / f"out{round_}{i}")], env=env, cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for i in range(2)
        ]  # fmt: skip
        for p in procs:
            _, err = p.communicate(timeout=600)
            statuses.append(p.returncode)
            assert "terminate called" not in err, err[-2000:]
            assert [x for x in err.splitlines() if x.startswith("error:")] == [want], err[-2000:]
    assert statuses == [2] * 4
