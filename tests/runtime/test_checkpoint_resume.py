"""Damaged, unfinished and unnamed checkpoints through the real stages under DeepSpeed (CPU): the
cases of ``test_checkpoint.py`` as a user meets them. A run of 9 steps saving every 3 is the
reference; a copy is "killed after step 6" (latest.json names step-6, step-9 never written), its
step-6 state damaged, and the same command run again. The resumed run must warn with the damaged
file's path, go back to step 3, and end with exactly the weights and losses of the reference.
Before checksums these cases ended in ``RuntimeError: PytorchStreamReader failed ...`` (truncated
state), a bare ``AssertionError`` (state file deleted), a silent resume from a damaged optimizer
state, or a silent restart from step 0 (latest.json deleted).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
from tests.support.forked import run_python  # noqa: E402
from tests.support.stage_env import stage_env  # noqa: E402  (tests/ is on sys.path: its conftest.py)

STATE_FILE = "mp_rank_00_model_states.pt"  # ZeRO-0: model, optimizer and client state
FLAGS = (
    "--model_name_or_path", "tiny", "--max_seq_len", "192", "--learning_rate", "2e-3",
    "--seed", "1234", "--disable_progress_bar", "--per_device_train_batch_size", "4",
    "--max_steps", "9", "--save_steps", "3", "--keep_checkpoints", "3", "--zero_stage", "0",
)  # fmt: skip


class Sft:
    """SFT runs of the tiny model sharing one MARLHF_HOME and data cache."""

    def __init__(self, root: Path):
        self.root = root

    def command(self, out: Path, prelude: str | None = None) -> list[str]:
        args = [*FLAGS, "--data_output_path", str(self.root / "cache"), "--output_dir", str(out)]
        if prelude is None:
            return [sys.executable, "-m", "marlhf.stages.sft", *args]
        run = "from marlhf.stages.sft import main; main()"
        return [sys.executable, "-c", prelude + "\n" + run, *args]

    def run(self, out: Path, prelude: str | None = None) -> subprocess.CompletedProcess:
        return run_python(
            self.command(out, prelude),
            cwd=REPO,
            env=stage_env(self.root / "home"),
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Sft:
    return Sft(tmp_path_factory.mktemp("ckpt_resume"))


@pytest.fixture(scope="module")
def reference(sft) -> Path:
    out = sft.root / "reference"
    proc = sft.run(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _killed_after_step_6(reference: Path, out: Path) -> Path:
    """A copy of the reference as a run killed right after its step-6 checkpoint."""
    shutil.copytree(reference, out)
    state = out / "train_state"
    shutil.rmtree(state / "model" / "step-9")
    latest = json.loads((state / "latest.json").read_text())
    (state / "latest.json").write_text(json.dumps({**latest, "tag": "step-6", "step": 6}))
    return out


def _losses(out: Path) -> list[tuple[int, float]]:
    from marlhf.runtime.tracking import read_metrics

    return [
        (r["step"], r["train/loss"])
        for r in read_metrics(out / "metrics.jsonl")
        if "train/loss" in r
    ]


def _same_as_reference(out: Path, reference: Path) -> None:
    from safetensors.torch import load_file

    assert _losses(out) == _losses(reference)
    a, b = load_file(out / "model.safetensors"), load_file(reference / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)


def _overwrite_exp_avg_sq(state_file: Path) -> None:
    """Overwrite 64 bytes of the largest exp_avg_sq in place with float 3.4e38 (same file size):
    torch.load reads the damaged values without a word."""
    sd = torch.load(state_file, weights_only=False)
    v = max((s["exp_avg_sq"] for s in sd["optimizer"]["state"].values()), key=torch.Tensor.numel)
    data = bytearray(state_file.read_bytes())
    at = bytes(data).find(v.numpy().tobytes())
    assert at > 0
    data[at + 4096 : at + 4096 + 64] = torch.full((16,), 3.4e38).numpy().tobytes()
    state_file.write_bytes(bytes(data))
    sd = torch.load(state_file, weights_only=False)
    assert max(float(s["exp_avg_sq"].max()) for s in sd["optimizer"]["state"].values()) > 1e38


@pytest.mark.parametrize(
    "damage", ["state file truncated", "exp_avg_sq overwritten", "state file deleted"]
)
def test_damaged_checkpoint_resumes_from_the_previous_one(sft, reference, damage):
    out = _killed_after_step_6(reference, sft.root / damage.replace(" ", "_"))
    state_file = out / "train_state" / "model" / "step-6" / STATE_FILE
    if damage == "state file truncated":
        state_file.write_bytes(state_file.read_bytes()[: state_file.stat().st_size // 2])
    elif damage == "exp_avg_sq overwritten":
        _overwrite_exp_avg_sq(state_file)
    else:
        state_file.unlink()
    proc = sft.run(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert str(state_file) in proc.stderr and "step-3" in proc.stderr
    assert "resumed from" in proc.stderr and "at step 3" in proc.stderr
    _same_as_reference(out, reference)


def test_deleted_latest_json_resumes_instead_of_starting_over(sft, reference):
    out = _killed_after_step_6(reference, sft.root / "no_latest")
    (out / "train_state" / "latest.json").unlink()
    first_rows = (out / "metrics.jsonl").read_text().splitlines()[:6]  # steps 1..6 as logged
    proc = sft.run(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert str(out / "train_state" / "latest.json") in proc.stderr and "at step 6" in proc.stderr
    assert (out / "metrics.jsonl").read_text().splitlines()[:6] == first_rows  # not trained again
    _same_as_reference(out, reference)


# writes of the step-6 training state go to /dev/full (torch's own writer fails as on a full disk)
# and the filesystem reports no free space, as it does once the disk is full
_FULL_DISK = """
import shutil, torch
_save, _usage = torch.save, shutil.disk_usage
def save(obj, f, *a, **kw):
    return _save(obj, "/dev/full" if "step-6" in str(f) else f, *a, **kw)
def usage(p):
    u = _usage(p)
    return type(u)(u.total, u.total, 0) if "step-6" in str(p) else u
torch.save, shutil.disk_usage = save, usage
"""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_names_the_checkpoint_and_the_rerun_resumes(sft, reference):
    out = sft.root / "disk_full"
    proc = sft.run(out, prelude=_FULL_DISK)
    assert proc.returncode != 0
    tag = out / "train_state" / "model" / "step-6"
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert "no space left on device" in last and str(tag) in last, proc.stderr[-4000:]
    # the step-3 checkpoint is the latest and complete: the same command again (space freed) goes on
    assert json.loads((out / "train_state" / "latest.json").read_text())["tag"] == "step-3"
    proc = sft.run(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "at step 3" in proc.stderr
    _same_as_reference(out, reference)


# --------------------------------------------------------------------------------------------------
# PPO: two engines (actor, critic) share each tag; the stage calls the same find_resume /
# load_train_state, so a damaged critic state falls back the same way.


def _ppo(root: Path, actor: Path, rm: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "marlhf.stages.ppo",
        "--actor_model_name_or_path", str(actor), "--critic_model_name_or_path", str(rm),
        "--data_output_path", str(root / "cache"), "--max_prompt_seq_len", "160",
        "--max_answer_seq_len", "12", "--per_device_generation_batch_size", "4",
        "--per_device_training_batch_size", "2", "--max_steps", "4", "--save_steps", "2",
        "--termination_condition", "fixed", "--ngram", "3", "--seed", "1234",
        "--output_dir", str(out), "--disable_progress_bar",
    ]  # fmt: skip
    return run_python(
        cmd, cwd=REPO, env=stage_env(root), capture_output=True, text=True, timeout=600
    )


def test_ppo_falls_back_when_the_critic_state_is_damaged(tmp_path):
    from marlhf.models.reward_model import RewardModel, save_reward_model
    from marlhf.models.zoo import build_tiny
    from marlhf.runtime.tracking import read_metrics

    actor = build_tiny(tmp_path / "actor")
    torch.manual_seed(0)
    from transformers import AutoTokenizer

    save_reward_model(
        RewardModel.from_pretrained(actor),
        AutoTokenizer.from_pretrained(actor),
        tmp_path / "rm",
        score_stats={"mean": 0.0, "std": 1.0},
    )
    full = tmp_path / "full"
    proc = _ppo(tmp_path, actor, tmp_path / "rm", full)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # killed right after the step-4 checkpoint, with the critic's state of step 4 damaged
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    rows = read_metrics(cut / "metrics.jsonl")
    (cut / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 4)
    )
    damaged = cut / "train_state" / "critic" / "step-4" / STATE_FILE
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    damaged.write_bytes(bytes(data))
    proc = _ppo(tmp_path, actor, tmp_path / "rm", cut)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert str(damaged) in proc.stderr and "step-2" in proc.stderr
    a = {r["step"]: r for r in read_metrics(full / "metrics.jsonl")}
    b = {r["step"]: r for r in read_metrics(cut / "metrics.jsonl")}
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("objective/score", "objective/kl", "loss/policy", "loss/value"):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-6), (step, key)
