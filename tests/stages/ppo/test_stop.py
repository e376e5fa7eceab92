"""PPO on SIGTERM / Ctrl-C: after the step under way, a resumable training state (no model
directories) unless the step's checkpoint was just saved, the bar and tracker closed, then
``StoppedBySignal`` with the line naming the step and where to resume from."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from marlhf.runtime import preemption
from marlhf.stages.ppo import loop


class _Closable:
    closed = False

    def close(self) -> None:
        self.closed = True


def _run(tmp_path: Path) -> SimpleNamespace:
    """What :func:`loop.stop_if_requested` reads of the loop's run."""
    return SimpleNamespace(
        plan=SimpleNamespace(total=10), out=tmp_path, models=None, tokenizer=None, log=None,
        models_cfg=None, run_config={}, settings=None,
    )  # fmt: skip


def test_a_signal_stops_with_the_line_naming_the_step_and_the_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setattr(preemption, "stop_requested", lambda: signal.SIGTERM)
    monkeypatch.setattr(loop, "save_checkpoint", lambda *args, **kw: None)
    with pytest.raises(preemption.StoppedBySignal) as stop:
        loop.stop_if_requested(
            _run(tmp_path), SimpleNamespace(step=4), _Closable(), _Closable(), False
        )
    assert stop.value.status == 128 + signal.SIGTERM
    assert "SIGTERM after step 4 of 10" in str(stop.value)
    assert str(tmp_path / "train_state") in str(stop.value)


def test_the_state_only_once_and_nothing_without_a_signal_or_after_the_last_step(
    monkeypatch, tmp_path
):
    saves = []

    def save(*args, **kw):
        saves.append(kw)

    monkeypatch.setattr(loop, "save_checkpoint", save)
    tracker, bar, run = _Closable(), _Closable(), _run(tmp_path)
    for signum, step, saved, want in [
        (signal.SIGINT, 3, False, [{"models_too": False}]),  # the training state alone
        (signal.SIGINT, 4, True, []),  # the step's checkpoint was just saved
    ]:
        saves.clear()
        monkeypatch.setattr(preemption, "stop_requested", lambda s=signum: s)
        with pytest.raises(preemption.StoppedBySignal):
            loop.stop_if_requested(run, SimpleNamespace(step=step), tracker, bar, saved)
        assert saves == want and tracker.closed and bar.closed
    for signum, step in [(0, 3), (signal.SIGTERM, 10)]:  # no signal; the run is over anyway
        saves.clear()
        monkeypatch.setattr(preemption, "stop_requested", lambda s=signum: s)
        loop.stop_if_requested(run, SimpleNamespace(step=step), _Closable(), _Closable(), False)
        assert saves == []
