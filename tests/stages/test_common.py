"""The supervised stages' shared loop (``marlhf.stages.common.supervised_loop``), driven in-process
with a stand-in engine: which rows each step trains on, when it logs, evaluates and saves, and that a
resumed run repeats the uninterrupted one (data position, learning rate, RNG). The references are
the contract written out by hand (step lists, epoch fractions) and an uninterrupted run.
"""

from __future__ import annotations

import doctest
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import marlhf.stages.common as common
from marlhf.config import LoggingConfig, OptimConfig
from marlhf.runtime.tracking import read_metrics
from marlhf.stages.common import StepPlan, plan_steps, supervised_loop

SEED = 7


class FakeEngine:
    """What the loop needs of a DeepSpeed engine: ``get_lr``, ``train``, ``step`` (the scheduler
    moves on: lr = 1 / (1 + steps)) and a checkpoint of that state."""

    def __init__(self):
        self.steps = 0

    def get_lr(self) -> list[float]:
        return [1.0 / (1 + self.steps)]

    def train(self) -> None:
        pass

    def step(self) -> None:
        self.steps += 1

    def save_checkpoint(self, path: str, tag: str, client_state: dict) -> None:
        Path(path, tag).mkdir(parents=True, exist_ok=True)
        torch.save({"steps": self.steps, "client": client_state}, Path(path, tag, "state.pt"))

    def load_checkpoint(self, path: str, tag: str, **_) -> tuple[str, dict]:
        state = torch.load(Path(path, tag, "state.pt"), weights_only=False)
        self.steps = state["steps"]
        return str(Path(path, tag)), state["client"]


class Run:
    """One call of ``supervised_loop`` over ``n_train`` rows; records what the callables saw."""

    def __init__(self, out: Path, plan: StepPlan, n_train: int, **log_kw):
        self.out, self.plan, self.n_train = out, plan, n_train
        self.log_cfg = LoggingConfig(
            output_dir=str(out), enable_tensorboard=False, disable_progress_bar=True, **log_kw
        )
        self.engine = FakeEngine()
        self.steps: list[tuple[int, list[list[int]], float]] = []  # (step, micro-batches, draw)
        self.evals: list[int] = []
        self.saves: list[tuple[int, Path, bool]] = []

    def train_step(self, micro_batches: list[list[int]], step: int) -> dict[str, float]:
        assert step == self.engine.steps  # the steps taken before this one
        draw = float(torch.rand(()))  # the stage's own randomness (dropout): restored on resume
        self.steps.append((step, micro_batches, draw))
        self.engine.step()
        return {"train/loss": float(step), "train/draw": draw}

    def evaluate(self) -> dict[str, float]:
        self.evals.append(self.engine.steps)
        return {"eval/loss": -float(self.engine.steps)}

    def save_model(self, step: int, path: Path, final: bool) -> None:
        self.saves.append((step, path, final))

    def __call__(self) -> int:
        return supervised_loop(
            self.engine,
            self.plan,
            self.log_cfg,
            n_train=self.n_train,
            seed=SEED,
            desc="test",
            logger=logging.getLogger("test"),
            train_step=self.train_step,
            evaluate=self.evaluate,
            save_model=self.save_model,
        )


def test_doctests():
    assert doctest.testmod(common, raise_on_error=False).failed == 0


def test_plan_steps_counts_full_global_batches_and_caps_at_max_steps():
    optim = OptimConfig(per_device_train_batch_size=3, gradient_accumulation_steps=2)
    assert plan_steps(13, optim, "x", "rows") == StepPlan(3, 2, 1, 2, 2)  # 13 // 6 = 2, 1 epoch
    optim = OptimConfig(per_device_train_batch_size=2, num_train_epochs=4, max_steps=7)
    assert plan_steps(9, optim, "x", "rows").total == 7  # 4 steps/epoch x 4 epochs, capped
    with pytest.raises(ValueError, match=r"SFT split has 5 examples, .*\(3 x 2 x 1\)"):
        plan_steps(5, OptimConfig(per_device_train_batch_size=3, gradient_accumulation_steps=2),
                   "SFT split", "examples")  # fmt: skip


def test_rows_cadence_and_checkpoints(tmp_path):
    """10 rows, global batch 2 (micro 1 x accumulation 2): 5 steps per epoch, 12 steps."""
    run = Run(tmp_path / "run", StepPlan(1, 2, 1, 5, 12), 10, save_steps=4, keep_checkpoints=5)
    assert run() == 12

    # step s of epoch e: rows perm_e[2s], perm_e[2s + 1] of the permutation seeded SEED + e
    for step, micro_batches, _ in run.steps:
        epoch, s = divmod(step, 5)
        perm = np.random.RandomState(SEED + epoch).permutation(10)
        assert micro_batches == [[int(perm[2 * s])], [int(perm[2 * s + 1])]]
    for epoch in (0, 1):  # a whole epoch sees every row once
        rows = [
            i for step, mbs, _ in run.steps[5 * epoch : 5 * epoch + 5] for mb in mbs for i in mb
        ]
        assert sorted(rows) == list(range(10))

    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    assert [r["train/loss"] for r in train] == list(range(12))  # the step's own metrics
    assert [r["lr"] for r in train] == [1.0 / (1 + s) for s in range(12)]  # read before the step
    assert [r["train/epoch"] for r in train] == pytest.approx([(s + 1) / 5 for s in range(12)])
    assert all(r["train/step_time_s"] >= 0 for r in train)

    # --eval_interval 0: at each epoch's end and at the last step
    assert run.evals == [5, 10, 12]
    assert [(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r] == [
        (5, -5.0), (10, -10.0), (12, -12.0)
    ]  # fmt: skip
    # --save_steps 4: steps 4 and 8 under checkpoints/ (each written aside, then renamed), the
    # last into the run directory itself
    ckpts = tmp_path / "run" / "checkpoints"
    assert run.saves == [
        (4, ckpts / ".partial-step-4", False),
        (8, ckpts / ".partial-step-8", False),
        (12, tmp_path / "run", True),
    ]
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-4", "step-8"]
    state = tmp_path / "run" / "train_state"
    assert json.loads((state / "latest.json").read_text())["tag"] == "step-12"
    assert sorted(p.name for p in (state / "model").iterdir()) == ["step-12", "step-4", "step-8"]


def test_eval_interval_and_log_interval(tmp_path, caplog):
    run = Run(tmp_path / "run", StepPlan(2, 1, 1, 5, 7), 10, eval_interval=3, log_interval=2)
    with caplog.at_level(logging.INFO):
        run()
    assert run.evals == [3, 6, 7]  # every 3 steps and the last
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [2, 4, 6, 7]  # and the last
    # --disable_progress_bar: the console's step lines as often as the scalars, and each evaluation
    lines = [r.getMessage() for r in caplog.records if r.name == "marlhf.progress"]
    assert [line.split(":")[0] for line in lines] == [f"test step {s}/7" for s in (2, 4, 6, 7)]
    evals = [m for r in caplog.records if r.name == "test" and "eval" in (m := r.getMessage())]
    assert evals == [f"step {s}: {{'eval/loss': {-float(s)}}}" for s in (3, 6, 7)]
    assert run.saves == [(7, tmp_path / "run", True)]  # --save_steps 0: only the final model
    assert [p.name for p in (tmp_path / "run" / "train_state" / "model").iterdir()] == ["step-7"]


def test_resume_repeats_the_uninterrupted_run(tmp_path):
    """Point latest.json back at step 4 (a run killed after it), start again: steps 5..12 train on
    the same rows with the same learning rate and the same RNG draws, and log once each."""
    plan = StepPlan(1, 2, 1, 5, 12)
    torch.manual_seed(0)
    full = Run(tmp_path / "full", plan, 10, save_steps=4, keep_checkpoints=5)
    full()

    shutil.copytree(tmp_path / "full", tmp_path / "resumed")
    latest = tmp_path / "resumed" / "train_state" / "latest.json"
    latest.write_text(json.dumps({**json.loads(latest.read_text()), "tag": "step-4", "step": 4}))
    torch.manual_seed(99)  # a fresh process seeds differently from where the checkpoint left off
    resumed = Run(tmp_path / "resumed", plan, 10, save_steps=4, keep_checkpoints=5)
    assert resumed() == 12

    assert resumed.steps == full.steps[4:]  # rows and RNG draws of steps 5..12
    assert resumed.evals == [5, 10, 12]
    a = read_metrics(tmp_path / "full" / "metrics.jsonl")
    b = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in b] == [r["step"] for r in a]  # one row per step and kind
    drop = ("time", "train/step_time_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in b] == [
        {k: v for k, v in r.items() if k not in drop} for r in a
    ]


def test_resume_never_starts_over(tmp_path):
    plan = StepPlan(2, 1, 1, 5, 3)
    Run(tmp_path / "run", plan, 10)()
    again = Run(tmp_path / "run", plan, 10, resume="never")
    again()
    assert [s for s, _, _ in again.steps] == [0, 1, 2]


def test_stage_state_travels_with_the_checkpoint(tmp_path):
    """What a stage hands over (the reward model: its latest evaluation) is saved with each
    training state and handed back on resume: the state of the checkpoint's own step."""

    class StatefulRun(Run):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.last_eval: int | None = None
            self.loaded: list[dict] = []

        def evaluate(self) -> dict[str, float]:
            self.last_eval = self.engine.steps
            return super().evaluate()

        def __call__(self) -> int:
            return supervised_loop(
                self.engine,
                self.plan,
                self.log_cfg,
                n_train=self.n_train,
                seed=SEED,
                desc="test",
                logger=logging.getLogger("test"),
                train_step=self.train_step,
                evaluate=self.evaluate,
                save_model=self.save_model,
                stage_state=lambda: {"last_eval": self.last_eval},
                load_stage_state=self.loaded.append,
            )

    plan = StepPlan(1, 1, 1, 10, 10)
    full = StatefulRun(
        tmp_path / "full", plan, 10, save_steps=2, eval_interval=3, keep_checkpoints=5
    )
    full()
    assert full.loaded == []
    shutil.copytree(tmp_path / "full", tmp_path / "resumed")
    latest = tmp_path / "resumed" / "train_state" / "latest.json"
    latest.write_text(json.dumps({**json.loads(latest.read_text()), "tag": "step-8", "step": 8}))
    resumed = StatefulRun(
        tmp_path / "resumed", plan, 10, save_steps=2, eval_interval=3, keep_checkpoints=5
    )
    resumed()
    assert resumed.loaded == [{"last_eval": 6}]  # evaluated at steps 3 and 6 before step 8


def test_run_stage_tears_the_process_group_down_after_success(monkeypatch):
    """A finished stage destroys its process group: left alive, gloo's threads can abort a rank at
    interpreter exit ("terminate called without an active exception") after the model is saved."""
    from marlhf.runtime.distributed import init_distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "")  # restored (or removed) afterwards, whatever the set-up writes
        monkeypatch.delenv(var)
    seen = []

    def train(cfg):
        init_distributed()
        seen.append(torch.distributed.is_initialized())

    common.run_stage(train, None)
    assert seen == [True]
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("error", ["data", "bug"])
def test_run_stage_tears_the_process_group_down_after_an_error(monkeypatch, capsys, error):
    """A stage that fails (a data error right after a collective: the data build shares its
    outcome) destroys its process group before the process exits. Left alive, a gloo worker
    thread still releasing the collective's tensors needs the GIL while the interpreter finalizes;
    CPython ends such a thread with pthread_exit, whose unwinding through the work's noexcept
    destructor calls std::terminate ("terminate called without an active exception", status 134,
    about one run in four)."""
    from marlhf.data.schema import DataError
    from marlhf.runtime.distributed import all_gather_object, init_distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)

    def train(cfg):
        init_distributed()
        all_gather_object(None)
        if error == "data":
            raise DataError('data/train.jsonl line 7: field "chosen" is empty')
        [].pop()  # a bug: its traceback is kept

    if error == "data":
        with pytest.raises(SystemExit) as e:
            common.run_stage(train, None)
        assert e.value.code == 2
        assert capsys.readouterr().err == (
            'error: data/train.jsonl line 7: field "chosen" is empty\n'
        )
    else:
        with pytest.raises(IndexError):
            common.run_stage(train, None)
    assert not torch.distributed.is_initialized()
