"""Resumable training state (``marlhf.runtime.checkpoint``): checksums written with every checkpoint and
checked on resume, the fallback to the newest complete checkpoint when the latest one is damaged,
unfinished or unnamed, stale temporaries of interrupted saves, full disks, and model checkpoint
directories that appear whole (written aside, then renamed; a kill mid-save leaves none).

Driven in-process through the public functions (``save_train_state``, ``find_resume``,
``load_train_state``, ``write_json``, ``save_reward_model_state``) with a stand-in engine that
writes two files per tag the way DeepSpeed's checkpoints do (``torch.save``). References: SHA-256
computed here with ``hashlib``, the bytes damaged by hand, the tags each case must pick written out.
The same cases through the real SFT stage and DeepSpeed are in ``test_checkpoint_resume.py``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from marlhf.runtime.checkpoint import find_resume, load_train_state, save_train_state, write_json
from tests.support.forked import run_python

MODEL_FILE = "mp_rank_00_model_states.pt"
OPTIM_FILE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


class Engine:
    """What the checkpoint functions use of a DeepSpeed engine, with a state that changes per step:
    ``weights`` (model file) and ``exp_avg_sq`` (optimizer file)."""

    def __init__(self, step: int = 0):
        self.set(step)

    def set(self, step: int) -> None:
        g = torch.Generator().manual_seed(step)
        self.weights = torch.randn(256, generator=g)
        self.exp_avg_sq = torch.rand(4096, generator=g)

    def save_checkpoint(self, path: str, tag: str, client_state: dict) -> None:
        d = Path(path, tag)
        d.mkdir(parents=True, exist_ok=True)
        torch.save({"module": self.weights, "client": client_state}, d / MODEL_FILE)
        torch.save({"exp_avg_sq": self.exp_avg_sq}, d / OPTIM_FILE)

    def load_checkpoint(self, path: str, tag: str, **_) -> tuple[str | None, dict | None]:
        d = Path(path, tag)
        if not d.is_dir():
            return None, None
        model = torch.load(d / MODEL_FILE, weights_only=False)
        self.weights = model["module"]
        self.exp_avg_sq = torch.load(d / OPTIM_FILE)["exp_avg_sq"]
        return str(d), model["client"]


def _run(tmp_path: Path, steps=(3, 6, 9), keep: int = 3, engines=("model",)) -> Path:
    """A run that saved training state at ``steps``; returns its train_state directory."""
    root = tmp_path / "run" / "train_state"
    for s in steps:
        save_train_state({n: Engine(s) for n in engines}, root, s, {"global_step": s}, keep)
    return root


def _resume(root: Path, resume: str = "auto", engines=("model",)) -> tuple[str, dict]:
    """find_resume + load_train_state as the stages call them: (tag found, client state)."""
    found = find_resume(root, resume)
    assert found is not None
    es = {n: Engine() for n in engines}
    return found[1], load_train_state(es, *found)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _point_latest(root: Path, step: int) -> None:
    """As if the run was killed after step ``step``: latest.json names it, newer tags are gone."""
    write_json(root / "latest.json", {"tag": f"step-{step}", "step": step, "engines": ["model"]})
    for tag in (root / "model").glob("step-*"):
        if int(tag.name.split("-")[1]) > step:
            shutil.rmtree(tag)


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# --------------------------------------------------------------------------------------------------
# checksums


def test_every_tag_records_the_sha256_of_each_file(tmp_path):
    root = _run(tmp_path)
    for s in (3, 6, 9):
        tag = root / "model" / f"step-{s}"
        manifest = json.loads((tag / "checksums.json").read_text())
        assert manifest["algorithm"] == "sha256"
        assert set(manifest["files"]) == {MODEL_FILE, OPTIM_FILE}
        for name, entry in manifest["files"].items():
            assert entry["sha256"] == _sha256(tag / name)
            assert entry["bytes"] == (tag / name).stat().st_size
        assert sorted(p.name for p in tag.iterdir()) == sorted(
            [MODEL_FILE, OPTIM_FILE, "checksums.json"]
        )  # no marker or temporary left behind
    assert json.loads((root / "latest.json").read_text())["tag"] == "step-9"


def test_64_bytes_overwritten_in_the_optimizer_state_fall_back(tmp_path, caplog):
    """The damage torch.load does not see: exp_avg_sq values become 3.4e38, same file size."""
    root = _run(tmp_path)
    _point_latest(root, 6)
    optim = root / "model" / "step-6" / OPTIM_FILE
    data = bytearray(optim.read_bytes())
    at = bytes(data).find(Engine(6).exp_avg_sq.numpy().tobytes()) + 1024
    data[at : at + 64] = torch.full((16,), 3.4e38).numpy().tobytes()
    optim.write_bytes(bytes(data))
    assert torch.load(optim)["exp_avg_sq"].max() > 1e38  # loads without a word

    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root)
    assert (tag, client["global_step"]) == ("step-3", 3)
    assert str(optim) in _warnings(caplog) and "checksum" in _warnings(caplog)
    assert optim.exists()  # kept for inspection


# --------------------------------------------------------------------------------------------------
# damaged or missing latest checkpoint


@pytest.mark.parametrize("damage", ["truncated", "file deleted", "folder deleted"])
def test_damaged_latest_checkpoint_falls_back_to_the_newest_complete(tmp_path, caplog, damage):
    root = _run(tmp_path)
    _point_latest(root, 6)
    state = root / "model" / "step-6" / MODEL_FILE
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif damage == "file deleted":
        state.unlink()
    else:
        shutil.rmtree(state.parent)
    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root)
    assert (tag, client["global_step"]) == ("step-3", 3)
    named = state if damage != "folder deleted" else state.parent
    assert str(named) in _warnings(caplog)
    assert "step-3" in _warnings(caplog)


def test_garbage_latest_json_falls_back_to_the_newest_complete(tmp_path, caplog):
    root = _run(tmp_path)
    (root / "latest.json").write_text('{"tag": "step-9", "st')
    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root)
    assert (tag, client["global_step"]) == ("step-9", 9)
    assert str(root / "latest.json") in _warnings(caplog)


def test_unfinished_save_is_skipped(tmp_path, caplog):
    """A save killed halfway: its files are there but its checksums never were."""
    root = _run(tmp_path, steps=(3, 6))
    d = root / "model" / "step-9"
    d.mkdir()
    (d / "SAVING").write_text("")
    Engine(9).save_checkpoint(str(root / "model"), "step-9", {"global_step": 9})
    write_json(root / "latest.json", {"tag": "step-9", "step": 9})
    with caplog.at_level(logging.WARNING):
        tag, _ = _resume(root)
    assert tag == "step-6"
    assert str(d) in _warnings(caplog) and "did not finish" in _warnings(caplog)


def test_no_complete_checkpoint_is_an_error_naming_the_directory(tmp_path):
    root = _run(tmp_path, steps=(3, 6), keep=2)
    for s in (3, 6):
        f = root / "model" / f"step-{s}" / MODEL_FILE
        f.write_bytes(f.read_bytes()[:100])
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(RuntimeError) as e:
        find_resume(root, "auto")
    msg = str(e.value)
    assert str(root) in msg and "step-6" in msg and "step-3" in msg and "--resume never" in msg
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing deleted


def test_explicit_resume_path_falls_back_too(tmp_path):
    root = _run(tmp_path)
    (root / "model" / "step-9" / OPTIM_FILE).unlink()
    other = tmp_path / "other" / "train_state"
    found = find_resume(other, str(root))
    assert found == (root, "step-6")


def test_checkpoint_without_checksums_still_resumes_and_falls_back_on_load_errors(tmp_path, caplog):
    """Checkpoints written before checksums were recorded: the named tag is loaded unverified; when
    it cannot be loaded, the next older one is, and the warning names the file that failed."""
    root = _run(tmp_path)
    for manifest in root.rglob("checksums.json"):
        manifest.unlink()
    assert _resume(root)[0] == "step-9"
    state = root / "model" / "step-9" / MODEL_FILE
    state.write_bytes(state.read_bytes()[:500])
    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root)
    assert client["global_step"] == 6
    assert str(root / "model" / "step-9") in _warnings(caplog)


# --------------------------------------------------------------------------------------------------
# latest.json deleted


def test_deleted_latest_json_resumes_from_the_newest_complete_with_a_warning(tmp_path, caplog):
    root = _run(tmp_path)
    (root / "latest.json").unlink()
    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root)
    assert (tag, client["global_step"]) == ("step-9", 9)
    assert "latest.json" in _warnings(caplog) and "step-9" in _warnings(caplog)


def test_two_engines_need_both_tags(tmp_path, caplog):
    """PPO's actor and critic: a tag counts only when every engine has it complete."""
    root = _run(tmp_path, engines=("actor", "critic"))
    (root / "latest.json").unlink()
    shutil.rmtree(root / "critic" / "step-9")
    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root, engines=("actor", "critic"))
    assert (tag, client["global_step"]) == ("step-6", 6)
    assert str(root / "critic" / "step-9") in _warnings(caplog)


def test_fresh_run_still_starts_from_zero(tmp_path):
    assert find_resume(tmp_path / "run" / "train_state", "auto") is None
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        find_resume(tmp_path / "run" / "train_state", str(tmp_path / "nowhere"))


# --------------------------------------------------------------------------------------------------
# rotation never deletes the last good checkpoint


def test_rotation_keeps_complete_tags_and_drops_unfinished_older_ones(tmp_path):
    root = _run(tmp_path, steps=(3,), keep=1)
    for s in (6, 12):  # unfinished saves of an earlier attempt: one below, one above the next step
        d = root / "model" / f"step-{s}"
        d.mkdir()
        (d / "SAVING").write_text("")
    save_train_state({"model": Engine(9)}, root, 9, {"global_step": 9}, keep=1)
    assert sorted(p.name for p in (root / "model").iterdir() if p.is_dir()) == ["step-12", "step-9"]
    save_train_state({"model": Engine(9)}, root, 10, {"global_step": 10}, keep=2)
    assert sorted(p.name for p in (root / "model").iterdir() if p.is_dir()) == [
        "step-10", "step-12", "step-9"
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------------
# stale temporaries


def test_stale_safetensors_temporaries_are_removed_at_start(tmp_path):
    """safetensors writes `.tmpXXXXXX` next to the target and renames it; a kill before the rename
    leaves a full model's size behind. Everything else in the directory stays."""
    run = tmp_path / "run"
    root = _run(tmp_path, steps=(3,))
    stale = [
        run / ".tmpAbC123",
        run / "checkpoints" / "step-3" / ".tmpq9Zx0w",
        run / "actor" / ".tmp000000",
        run / "checkpoints" / "step-3" / "critic" / ".tmpzzzzzz",
        root / "latest.json.tmp",
    ]
    keep = [
        run / "model.safetensors",
        run / ".tmpnotes.txt",
        run / "checkpoints" / "step-3" / "notes.tmp",
        run / "other" / "deeper" / ".tmpAbC123",  # not a place a checkpoint is written
    ]
    for p in stale + keep:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * 1000)
    assert find_resume(root, "auto") == (root, "step-3")
    assert [p for p in stale if p.exists()] == []
    assert all(p.exists() for p in keep)
    # a run started over (--resume never) cleans up too
    stale[0].write_bytes(b"x")
    assert find_resume(root, "never") is None
    assert not stale[0].exists()


# --------------------------------------------------------------------------------------------------
# full disk


def _disk_full(monkeypatch):
    """The filesystem reports no free space (what shutil.disk_usage says after ENOSPC)."""
    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 0)
    )


class FullDiskEngine(Engine):
    """Writes its checkpoint through torch's own writer into /dev/full: the error torch raises on a
    full disk ("unexpected pos ..." / "iostream error") says nothing about space or path."""

    def save_checkpoint(self, path: str, tag: str, client_state: dict) -> None:
        Path(path, tag).mkdir(parents=True, exist_ok=True)
        torch.save({"module": self.weights}, "/dev/full")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_during_training_state_names_the_path_and_keeps_the_last_good(
    tmp_path, monkeypatch, caplog
):
    root = _run(tmp_path, steps=(3,), keep=1)
    with pytest.raises(RuntimeError):  # the raw error: no path, no cause
        torch.save({"x": torch.zeros(10)}, "/dev/full")
    _disk_full(monkeypatch)
    with pytest.raises(OSError) as e:
        save_train_state({"model": FullDiskEngine(6)}, root, 6, {"global_step": 6}, keep=1)
    assert e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert "no space left on device" in msg and str(root / "model" / "step-6") in msg
    assert "0 B free" in msg
    monkeypatch.undo()
    # the last good checkpoint is untouched and is what a resume takes
    assert json.loads((root / "latest.json").read_text())["tag"] == "step-3"
    with caplog.at_level(logging.WARNING):
        assert _resume(root)[1]["global_step"] == 3


def test_failed_write_without_a_full_disk_names_the_path(tmp_path):
    root = _run(tmp_path, steps=(3,))
    with pytest.raises(RuntimeError, match="step-6"):
        save_train_state({"model": FullDiskEngine(6)}, root, 6, {"global_step": 6}, keep=1)


def test_full_disk_in_write_json_names_the_file(tmp_path, monkeypatch):
    import builtins

    real_open = builtins.open

    def full_open(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if "w" in mode and str(path).endswith(".json.tmp"):
            f.close()
            return real_open("/dev/full", mode, *a, **kw)
        return f

    monkeypatch.setattr(builtins, "open", full_open)
    target = tmp_path / "run" / "run_config.json"
    with pytest.raises(OSError) as e:
        write_json(target, {"a": 1})
    assert e.value.errno == errno.ENOSPC
    assert "no space left on device" in str(e.value) and str(target) in str(e.value)


def test_full_disk_while_saving_a_reward_model_names_the_directory(tmp_path, monkeypatch):
    """safetensors reports ENOSPC inside its own error type; PPO's critic and the RM stage save
    through save_reward_model_state."""
    import safetensors.torch
    import transformers.modeling_utils  # noqa: F401  (binds the real save_file before the patch)
    from safetensors import SafetensorError
    from transformers import GPT2Config

    from marlhf.models.reward_model import save_reward_model_state

    def full(*a, **kw):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    cfg = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)
    state = {"backbone.wte.weight": torch.zeros(16, 8), "v_head.weight": torch.zeros(1, 8)}
    with pytest.raises(OSError) as e:
        save_reward_model_state(state, cfg, None, tmp_path / "critic")
    assert e.value.errno == errno.ENOSPC
    assert "no space left on device" in str(e.value) and str(tmp_path / "critic") in str(e.value)


def test_full_disk_while_saving_a_causal_lm_names_the_directory(tmp_path, monkeypatch):
    """The SFT model and PPO's actor: transformers' save_pretrained through safetensors."""
    import transformers.modeling_utils
    from safetensors import SafetensorError
    from transformers import GPT2Config, GPT2LMHeadModel

    from marlhf.models.save import save_hf_causal_lm

    def full(*a, **kw):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    target = tmp_path / "run" / "checkpoints" / "step-3"
    with pytest.raises(OSError) as e:
        save_hf_causal_lm(model, None, target, zero_stage=0, run_config={}, ds_config={})
    assert e.value.errno == errno.ENOSPC
    assert "no space left on device" in str(e.value) and str(target) in str(e.value)


# --------------------------------------------------------------------------------------------------
# model checkpoints written aside, then renamed (checkpoints/step-N appears whole)


def test_staged_directory_appears_whole_and_replaces_the_old_copy(tmp_path):
    from marlhf.runtime.checkpoint_files import staged_directory

    path = tmp_path / "checkpoints" / "step-3"
    with staged_directory(path) as where:
        assert where != path and not path.exists()  # written elsewhere meanwhile
        (where / "model.safetensors").write_bytes(b"new")
    assert (path / "model.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-3"]
    # saved again (a resumed run): the old copy is replaced, nothing of it left
    (path / "stale.bin").write_bytes(b"old")
    with staged_directory(path) as where:
        (where / "model.safetensors").write_bytes(b"newer")
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors"]
    assert (path / "model.safetensors").read_bytes() == b"newer"
    # a save that fails leaves the previous complete copy and no partial directory
    with pytest.raises(OSError, match="disk"):
        with staged_directory(path) as where:
            (where / "model.safetensors").write_bytes(b"half")
            raise OSError("disk went away")
    assert (path / "model.safetensors").read_bytes() == b"newer"
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-3"]


def test_a_save_killed_midway_leaves_no_step_directory_and_is_swept(tmp_path):
    """A process killed (SIGKILL) inside the block: no ``step-N`` (or the previous one, intact), a
    ``.partial-`` directory, removed at the next start by ``find_resume``."""
    import signal
    import sys

    run = tmp_path / "run"
    root = _run(tmp_path, steps=(3,))
    path = run / "checkpoints" / "step-6"
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from marlhf.runtime.checkpoint_files import staged_directory\n"
        "with staged_directory(Path(sys.argv[1])) as where:\n"
        "    (where / 'config.json').write_text('{}')\n"
        "    (where / 'model.safetensors').write_bytes(b'x' * 1000)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = run_python([sys.executable, "-c", code, str(path)], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not path.exists()
    partial = run / "checkpoints" / ".partial-step-6"
    assert (partial / "model.safetensors").exists()
    assert find_resume(root, "auto") == (root, "step-3")
    assert not partial.exists()


# --------------------------------------------------------------------------------------------------
# a kill during the first save; a checkpoint whose checksums were deleted; non-finite weights


@pytest.mark.parametrize("engines", [("model",), ("actor", "critic")])
def test_kill_during_the_first_save_starts_over_as_fresh(tmp_path, caplog, engines):
    """The first checkpoint's save was cut (no latest.json yet, every tag unfinished or missing an
    engine): nothing was ever resumable, so the same command starts over, with a warning."""
    root = tmp_path / "run" / "train_state"
    first = root / engines[0] / "step-4"
    first.mkdir(parents=True)
    (first / "SAVING").write_text("")
    Engine(4).save_checkpoint(str(root / engines[0]), "step-4", {"global_step": 4})
    if len(engines) == 2:  # the actor's tag finished, the critic's never started
        from marlhf.runtime.checkpoint_files import finish_tag

        finish_tag(first)
    with caplog.at_level(logging.WARNING):
        assert find_resume(root, "auto", engines=list(engines)) is None
    assert "stopped while saving its first one" in _warnings(caplog)
    assert str(first) in _warnings(caplog) or "critic" in _warnings(caplog)
    # an explicit --resume path is still an error, and so is a run that completed a checkpoint
    with pytest.raises(RuntimeError, match="no complete checkpoint"):
        find_resume(tmp_path / "elsewhere", str(root), engines=list(engines))
    write_json(root / "latest.json", {"tag": "step-4", "step": 4})
    with pytest.raises(RuntimeError, match="no complete checkpoint"):
        find_resume(root, "auto", engines=list(engines))


def test_checkpoint_whose_checksums_were_deleted_yields_to_the_newest_verified(tmp_path, caplog):
    """In a run whose checkpoints carry checksums, the latest one without its checksums.json
    cannot be verified (here its optimizer state is damaged as well): the newest verified one is
    resumed, with a warning; without any verified one the unverified is taken, warned about."""
    root = _run(tmp_path)
    latest = root / "model" / "step-9"
    (latest / "checksums.json").unlink()
    optim = latest / OPTIM_FILE
    torch.save({"exp_avg_sq": torch.full((4096,), 2.8e38)}, optim)
    with caplog.at_level(logging.WARNING):
        tag, client = _resume(root)
    assert (tag, client["global_step"]) == ("step-6", 6)
    warned = _warnings(caplog)
    assert f"{latest} has no checksums.json while the run's other checkpoints have one" in warned
    caplog.clear()
    for s in (3, 6):
        (root / "model" / f"step-{s}" / OPTIM_FILE).write_bytes(b"damaged")
    with caplog.at_level(logging.WARNING):
        _, tag = find_resume(root, "auto")
    assert tag == "step-9" and "no verified checkpoint to take instead" in _warnings(caplog)


def test_non_finite_weights_are_never_saved(tmp_path):
    from marlhf.runtime.checkpoint import gather_state_dict
    from marlhf.runtime.finite import NonFiniteError

    model = torch.nn.Linear(3, 2)
    assert set(gather_state_dict(model, zero_stage=0)) == {"weight", "bias"}
    with torch.no_grad():
        model.bias[1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"refusing to save the model: .*\(bias\)"):
        gather_state_dict(model, zero_stage=0)

    class WithModule(Engine):
        module = model

    root = tmp_path / "train_state"
    with pytest.raises(NonFiniteError, match="refusing to save"):
        save_train_state({"model": WithModule(1)}, root, 1, {"global_step": 1}, 2)
    assert not root.exists()
