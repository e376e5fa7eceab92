"""metrics.jsonl and TensorBoard after a resume: one row per step, the rows before it untouched."""

from __future__ import annotations

import json
import time

import pytest

from marlhf.config import LoggingConfig
from marlhf.runtime.tracking import Tracker, read_metrics, truncate_metrics


def _run(out, steps, start_step=0, tag="first"):
    """A fake run: a train row every step, an eval row every 3rd; values tell the attempts apart."""
    tracker = Tracker(LoggingConfig(output_dir=str(out)), start_step=start_step)
    for s in steps:
        tracker.log({"train/loss": 10.0 * s + (0.5 if tag == "second" else 0.0)}, s)
        if s % 3 == 0:
            tracker.log({"eval/ppl": 100.0 + s}, s)
    tracker.close()


def test_resume_keeps_one_row_per_step_and_the_earlier_rows_untouched(tmp_path):
    # killed after logging step 5, resumed from the checkpoint of step 3: steps 4, 5 logged again
    _run(tmp_path, range(1, 6))
    before = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert [json.loads(x)["step"] for x in before] == [1, 2, 3, 3, 4, 5]
    _run(tmp_path, range(4, 6), start_step=3, tag="second")

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert lines[:4] == before[:4]  # steps 1..3 byte for byte (times included)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 3, 4, 5]
    train = [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
    assert train == [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.5), (5, 50.5)]
    assert not list(tmp_path.glob(".metrics.jsonl.*")), "temporary file left behind"


def test_tensorboard_hides_the_killed_attempts_later_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(tmp_path, range(1, 6))
    _run(tmp_path, range(4, 6), start_step=3, tag="second")
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert got == [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.5), (5, 50.5)]
    assert [e.step for e in acc.Scalars("eval/ppl")] == [3]


def test_truncate_drops_a_torn_last_line_and_leaves_a_clean_file_alone(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + '{"step": 3, "a"')  # killed in the middle of a write
    assert truncate_metrics(path, 5) == 1
    assert path.read_text() == text
    inode = path.stat().st_ino
    assert truncate_metrics(path, 2) == 0 and path.stat().st_ino == inode  # not rewritten
    assert truncate_metrics(path, 0) == 2 and path.read_text() == ""  # a fresh start
    assert truncate_metrics(tmp_path / "absent.jsonl", 0) == 0


def test_non_finite_values_are_null_in_strict_json(tmp_path):
    from marlhf.config import LoggingConfig
    from marlhf.runtime.tracking import Tracker

    t = Tracker(LoggingConfig(output_dir=str(tmp_path), enable_tensorboard=False))
    t.log({"macro/entropy_threshold": float("inf"), "loss": float("nan"), "ok": 1.5}, 1)
    t.close()
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    assert "Infinity" not in line and "NaN" not in line
    row = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert row["macro/entropy_threshold"] is None and row["loss"] is None and row["ok"] == 1.5


# --------------------------------------------------------------------------------------------------
# --report_to: wandb (offline) and trackio (local), run names


def test_report_to_is_validated():
    with pytest.raises(ValueError, match="--report_to"):
        LoggingConfig(report_to=("tensorboard", "mlflow"))
    with pytest.raises(ValueError, match="--report_to"):
        LoggingConfig(report_to=("none", "wandb"))
    assert LoggingConfig(report_to=("none",)).report_to == ("none",)


def test_report_to_none_writes_only_the_jsonl(tmp_path):
    tracker = Tracker(LoggingConfig(output_dir=str(tmp_path), report_to=("none",)))
    tracker.log({"train/loss": 1.0}, 1)
    tracker.close()
    assert not (tmp_path / "tensorboard").exists()
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["train/loss"] == 1.0


def test_missing_tracker_package_is_one_error_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ValueError, match="--report_to wandb: the wandb package is not installed"):
        Tracker(LoggingConfig(output_dir=str(tmp_path), report_to=("wandb",)))
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("stage", ["sft", "rm", "ppo", "preflight"])
def test_missing_tracker_package_is_refused_when_the_flags_are_parsed(stage, monkeypatch, capsys):
    """Not after a start-up of seconds (the tracker opens after the models are loaded): the flags'
    parse refuses it, with how to install it; ``marlhf preflight`` too."""
    import sys

    from marlhf.commands import main as marlhf

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "trackio", None)
    argv = [stage, *(["sft"] if stage == "preflight" else []), "--report_to", "tensorboard,wandb"]
    with pytest.raises(SystemExit) as e:
        marlhf(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 2
    assert "error: --report_to tensorboard,wandb: wandb is not installed" in err
    assert "pip install 'ma-rlhf[trackers]'" in err


def test_tracker_check_reads_the_environment_not_the_saved_config(monkeypatch):
    import sys
    import types

    from marlhf.cli import config_from_dict, config_to_dict, parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))  # installed
    cfg = parse_config(PPOStageConfig, ["--report_to", "wandb"])
    assert cfg.log.report_to == ("wandb",)
    monkeypatch.setitem(sys.modules, "wandb", None)  # compared where wandb is not installed
    assert config_from_dict(PPOStageConfig, config_to_dict(cfg)).log.report_to == ("wandb",)
    with pytest.raises(SystemExit):
        parse_config(PPOStageConfig, ["--report_to", "wandb"])


def test_wandb_offline_logs_the_run_under_its_name(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggingConfig(output_dir=str(tmp_path / "run"), report_to=("wandb",))
    tracker = Tracker(cfg, run_name="MA-PPO n=5", config={"macro": {"ngram": 5}})
    run = tracker.wandb
    assert (run.name, dict(run.config)) == ("MA-PPO n=5 run", {"macro": {"ngram": 5}})
    for s in (1, 2, 3):
        tracker.log({"objective/score": 0.1 * s}, s)
    tracker.close()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(run.id)  # the run id the output dir gives
    # wandb's service writes the run file on its own schedule: wait for it (bounded)
    data = runs[0] / f"run-{run.id}.wandb"
    for _ in range(120):
        if data.exists() and b"objective/score" in data.read_bytes():
            break
        time.sleep(0.5)
    assert b"MA-PPO n=5 run" in data.read_bytes() and b"objective/score" in data.read_bytes()


def test_trackio_logs_locally(tmp_path, monkeypatch):
    trackio = pytest.importorskip("trackio")
    from trackio.sqlite_storage import SQLiteStorage

    # trackio reads $TRACKIO_DIR at import: point its modules' copies at the test's directory
    monkeypatch.setattr("trackio.utils.TRACKIO_DIR", tmp_path / "trackio")
    monkeypatch.setattr("trackio.sqlite_storage.TRACKIO_DIR", tmp_path / "trackio")
    cfg = LoggingConfig(
        output_dir=str(tmp_path / "run"), report_to=("trackio",), tracker_project="marlhf-test"
    )
    tracker = Tracker(cfg, run_name="GRPO")
    for s in (1, 2):
        tracker.log({"objective/score": float(s)}, s)
    tracker.close()
    del trackio
    logs = SQLiteStorage.get_logs(project="marlhf-test", run="GRPO run")
    assert [r["objective/score"] for r in logs] == [1.0, 2.0]
    assert list((tmp_path / "trackio").glob("marlhf-test*.db"))
