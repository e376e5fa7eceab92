"""What every stage does around its own loop: process group, seeding, logging, progress, resume.

The supervised stages (SFT, reward model) share their set-up, :func:`setup_supervised`, and their
whole loop, :func:`supervised_loop`: they differ only in their data, their model, and what one
optimizer step, an evaluation and a saved model are.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from marlhf.cli import config_to_dict, flag_values
from marlhf.config import LoggingConfig, OptimConfig
from marlhf.data.cache import BuilderFailed
from marlhf.models.context import check_context
from marlhf.models.load import load_tokenizer
from marlhf.runtime import preemption, startup
from marlhf.runtime.batching import epoch_permutation, step_micro_batches, steps_per_epoch
from marlhf.runtime.checkpoint import (
    find_resume,
    load_train_state,
    rng_state,
    save_train_state,
    set_rng_state,
    write_json,
)
from marlhf.runtime.checkpoint_files import staged_directory
from marlhf.runtime.distributed import (
    init_distributed,
    is_main,
    rank,
    shutdown_distributed,
    world_size,
)
from marlhf.runtime.engine import build_train_engine
from marlhf.runtime.run_lock import lock_output_dir
from marlhf.runtime.run_settings import SETTINGS_FILE, check_resume_settings, settings_writer
from marlhf.runtime.run_settings import settings as settings_record
from marlhf.runtime.tracking import Tracker
from marlhf.stages.config import SupervisedConfig
from marlhf.stages.exits import raised_on_purpose, report_and_exit, tear_down_process_group


def run_stage(train: Callable, cfg) -> None:
    """A stage's ``main``: ``train(cfg)``, with an error raised on purpose (bad input, a data row,
    a model of the wrong kind, no checkpoint, a non-finite loss, ...: the message names the thing)
    reported as one ``error:`` line and an exit status instead of a traceback from every rank
    (:mod:`marlhf.stages.exits`); ``MARLHF_TRACEBACK=1`` shows the traceback too. A rank that
    waited for another rank's failed data build (:class:`marlhf.data.cache.BuilderFailed`) exits
    with it, quietly (rank 0 names the failing rank, which reports its own error). A run stopped
    by SIGTERM or SIGINT after saving a checkpoint prints one line and exits with 128 + the
    signal's number (:mod:`marlhf.runtime.preemption`). The process group is torn down on every
    path: after a successful ``train`` the ranks meet once more first."""
    try:
        _run_and_exit(train, cfg)
    finally:
        preemption.uninstall()


def _run_and_exit(train: Callable, cfg) -> None:
    try:
        train(cfg)
    except preemption.StoppedBySignal as e:
        if is_main():
            print(str(e), file=sys.stderr, flush=True)
        tear_down_process_group()
        raise SystemExit(e.status) from None
    except BuilderFailed as e:
        if os.environ.get("MARLHF_TRACEBACK"):
            tear_down_process_group()
            raise
        if is_main():
            print(f"error: the data build failed on {e}", file=sys.stderr, flush=True)
        tear_down_process_group()
        raise SystemExit(2 if e.data_error else 1) from None
    except Exception as e:
        if os.environ.get("MARLHF_TRACEBACK") or not raised_on_purpose(e):
            tear_down_process_group()
            raise
        report_and_exit(e)
    except BaseException:  # SystemExit, KeyboardInterrupt: leave, without the group
        tear_down_process_group()
        raise
    shutdown_distributed()


def setup_logging() -> None:
    # torch.distributed's deprecation notices fire on every ZeRO collective; once is plenty
    warnings.filterwarnings("once", category=FutureWarning, module="torch.distributed")
    level = logging.INFO if is_main() else logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed", "datasets", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start(ds_cfg, seed: int, progress_bars: bool = True) -> None:
    """Initialise the process group (deepspeed launcher, torchrun, or plain python) and seeds.
    Without ``progress_bars`` (``--disable_progress_bar``) the libraries' bars are off too
    (transformers' weight loading, datasets')."""
    startup.mark("imports")
    if not progress_bars:
        import datasets
        import transformers

        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    preemption.install()  # SIGTERM / SIGINT: stop now (set-up), or after a checkpoint (training)
    init_distributed(ds_cfg.local_rank, ds_cfg.dist_timeout_s)
    setup_logging()
    try:
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
    except ImportError:  # pragma: no cover
        pass
    seed_everything(seed)
    logging.getLogger("marlhf").info("world size %d", world_size())
    startup.mark("distributed")


class StepLines:
    """The progress bar's stand-in when bars are off (``--disable_progress_bar``): one log line per
    step, ``<desc> step N/T: k=v ...`` with the fields the bar would show (the fields come with
    ``set_postfix`` after ``update``; a step without them is logged at the next update or close);
    with ``every`` (``--log_interval``) only every ``every``-th step's line and the last's."""

    def __init__(self, total: int, initial: int, desc: str, enabled: bool, every: int = 1):
        self.total, self.n, self.desc, self.enabled = total, initial, desc, enabled
        self.every = every
        self._pending = False
        self._log = logging.getLogger("marlhf.progress")

    def update(self, n: int = 1) -> None:
        self._flush({})
        self.n += n
        self._pending = True

    def set_postfix(self, **fields) -> None:
        self._flush(fields)

    def _flush(self, fields: dict) -> None:
        due = self.n % self.every == 0 or self.n == self.total
        if self._pending and self.enabled and due:
            shown = " ".join(f"{k}={v}" for k, v in fields.items())
            self._log.info(
                "%s step %d/%d%s", self.desc, self.n, self.total, f": {shown}" * bool(shown)
            )
        self._pending = False

    def close(self) -> None:
        self._flush({})


def progress(total: int, initial: int, desc: str, disable: bool = False, every: int = 1):
    """A tqdm bar on rank 0 (a no-op object elsewhere); with ``disable``, one log line every
    ``every`` steps (``--log_interval``) and at the last, on rank 0, instead (:class:`StepLines`)."""
    if disable:
        return StepLines(total, initial, desc, enabled=is_main(), every=every)
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        disable=not is_main(),
        dynamic_ncols=True,
        file=sys.stderr,
    )


def ensure_output_dir(path: str) -> Path:
    """The run's output directory, created and locked for this run (one run per directory:
    :mod:`marlhf.runtime.run_lock`; a second run stops naming the holder, a directory that cannot
    be written stops the run saying why). Collective when distributed."""
    out = Path(path)
    lock_output_dir(out)
    return out


def to_device(batch: dict, device) -> dict:
    """A collated batch with its tensors moved to ``device``."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def write_run_config(out: Path, cfg, ds_json: dict) -> dict:
    """Write the resolved ``cfg`` (``run_config.json``) and ``ds_json`` (``ds_config.json``) into
    ``out`` on rank 0; return the run config, which is saved next to every checkpoint too."""
    run_config = config_to_dict(cfg)
    if is_main():
        write_json(out / "run_config.json", run_config)
        write_json(out / "ds_config.json", ds_json)
    return run_config


# --------------------------------------------------------------------------------------------------
# the supervised stages' loop (SFT, reward model)


@dataclass(frozen=True)
class StepPlan:
    """How a supervised stage walks its training rows: each optimizer step takes ``accumulation``
    micro-batches of ``micro`` rows on each of ``world`` ranks; an epoch is ``steps_per_epoch`` such
    global batches (the rest of the rows is dropped); the run is ``total`` optimizer steps."""

    micro: int
    accumulation: int
    world: int
    steps_per_epoch: int
    total: int

    @property
    def global_batch(self) -> int:
        """Rows per optimizer step, over all ranks."""
        return self.micro * self.accumulation * self.world


def plan_steps(n: int, optim: OptimConfig, split: str, unit: str) -> StepPlan:
    """The plan for ``n`` training rows (``unit``: what a row is, for the error) of the ``split``:
    ``--max_steps`` optimizer steps when given (the data are looped over as often as needed, each
    epoch in its own order), else ``--num_train_epochs`` epochs.

    >>> from marlhf.config import OptimConfig
    >>> optim = OptimConfig(per_device_train_batch_size=2, num_train_epochs=3)
    >>> plan = plan_steps(10, optim, "SFT split", "examples")
    >>> plan.steps_per_epoch, plan.total, plan.global_batch
    (5, 15, 2)
    >>> plan_steps(10, OptimConfig(per_device_train_batch_size=2, max_steps=12), "SFT", "rows").total
    12
    """
    micro, acc, ws = (
        optim.per_device_train_batch_size,
        optim.gradient_accumulation_steps,
        world_size(),
    )
    spe = steps_per_epoch(n, micro, acc, ws)
    if spe == 0:
        raise ValueError(
            f"{split} has {n} {unit}, fewer than one global batch "
            f"({micro} x {acc} x {ws}); lower the batch size or add data"
        )
    total = optim.max_steps or spe * optim.num_train_epochs
    return StepPlan(micro, acc, ws, spe, total)


# progress-bar fields shown when the stage reports them: label -> (metric, format)
_BAR_FIELDS = {"loss": ("train/loss", ".4f"), "acc": ("train/accuracy", ".3f")}


def _resume(
    engine,
    state_root: Path,
    resume: str,
    logger: logging.Logger,
    load_stage_state: Callable[[dict], None] | None,
) -> int:
    """Restore the engine, RNG and the stage's state from the checkpoint to resume from (if any);
    return its step (0 without one)."""
    found = find_resume(state_root, resume, engines=["model"])
    if found is None:
        return 0
    client = load_train_state({"model": engine}, *found)
    set_rng_state(client["rng"])
    if load_stage_state is not None and "stage" in client:  # checkpoints of older runs lack it
        load_stage_state(client["stage"])
    logger.info("resumed from %s at step %d", found[0], client["global_step"])
    return client["global_step"]


def check_resume(cfg, log_cfg: LoggingConfig, derived: dict[str, int]) -> dict:
    """This run's settings (``cfg``'s flags and the ``derived`` global sizes), checked against
    those of the checkpoint it resumes from (:mod:`marlhf.runtime.run_settings`: a change to what
    is trained is refused without ``--resume_with_changes``); call it before loading any model.
    The result is saved with every training state."""
    record = settings_record(flag_values(cfg), derived)
    out = Path(log_cfg.output_dir)
    check_resume_settings(
        out / "train_state", log_cfg.resume, log_cfg.resume_with_changes, record, out
    )
    return record


def _eval_due(log_cfg: LoggingConfig, step: int, steps_per_epoch: int, total: int) -> bool:
    """Whether step ``step`` ends with an evaluation: every ``--eval_interval`` steps (0: at each
    epoch's end) and at the last step."""
    if log_cfg.eval_interval:
        return step % log_cfg.eval_interval == 0 or step == total
    return step % steps_per_epoch == 0 or step == total


def log_eval(metrics: dict[str, float], step: int, tracker: Tracker, logger) -> None:
    """An evaluation's metrics to the tracker and, on rank 0, one line to the console."""
    tracker.log(metrics, step)
    if is_main():
        logger.info("step %d: %s", step, {k: round(v, 4) for k, v in metrics.items()})


def _stop_if_requested(step: int, total: int, saved: bool, checkpoint, closing, state_root) -> None:
    """After ``step``: when any rank got SIGTERM or SIGINT (a collective), save the training state
    (unless this step's checkpoint was just saved), close ``closing`` (the bar, the tracker) and
    raise :class:`marlhf.runtime.preemption.StoppedBySignal`."""
    signum = preemption.stop_requested()
    if not signum:
        return
    if not saved:  # the training state only: what a resume needs, soonest
        checkpoint(step, None, final=False)
    for thing in closing:
        thing.close()
    raise preemption.StoppedBySignal(
        signum, preemption.stop_message(signum, step, total, state_root)
    )


def supervised_loop(
    engine,
    plan: StepPlan,
    log_cfg: LoggingConfig,
    *,
    n_train: int,
    seed: int,
    desc: str,
    logger: logging.Logger,
    train_step: Callable[[list[list[int]], int], dict[str, float]],
    evaluate: Callable[[], dict[str, float]],
    save_model: Callable[[int, Path, bool], None],
    stage_state: Callable[[], dict] | None = None,
    load_stage_state: Callable[[dict], None] | None = None,
    settings: dict | None = None,
    run_name: str | None = None,
    run_config: dict | None = None,
) -> int:
    """Train a supervised stage (SFT, reward model) from its latest checkpoint to ``plan.total``
    optimizer steps; return the last step. The stage gives the algorithm:

    - ``train_step(micro_batches, step)``: one optimizer step on this rank's micro-batches (lists of
      training-row indices) after ``step`` steps; returns the step's metrics over all ranks
      (``train/loss`` at least);
    - ``evaluate()``: the eval metrics (every rank calls it);
    - ``save_model(step, path, final)``: the model as a directory later stages load (every rank
      calls it); ``final`` for the last save, into ``output_dir`` itself;
    - ``stage_state()`` / ``load_stage_state(state)`` (optional): what the stage itself must carry
      over a resume (the reward model: its latest evaluation), saved with the training state
      as are ``settings`` (:func:`check_resume`), for the next resume to compare with.

    The loop does the rest, the same for every supervised stage:

    1. resume: engine, optimizer and scheduler, step, RNG and the stage's state from
       ``output_dir/train_state`` (``--resume``; a damaged or unfinished checkpoint is skipped for
       the newest complete one, see ``marlhf.runtime.checkpoint.find_resume``); the data position is the
       step itself (``marlhf.runtime.batching``);
    2. step ``s`` of epoch ``e`` trains on global batch ``s`` of the permutation seeded
       ``seed + e``;
    3. every ``--log_interval`` steps and at the last, the step's metrics plus ``lr`` (the rate the
       step used), ``train/step_time_s`` and ``train/epoch`` (fractional);
    4. an evaluation every ``--eval_interval`` steps (0: at each epoch's end) and at the last step;
    5. every ``--save_steps`` steps a model in ``checkpoints/step-N`` and a resumable state (the
       newest ``--keep_checkpoints`` kept); at the end the final model and state; on SIGTERM or
       SIGINT (any rank), a resumable state after the step, then ``StoppedBySignal``.
    """
    out = Path(log_cfg.output_dir)
    state_root = out / "train_state"
    global_step = _resume(engine, state_root, log_cfg.resume, logger, load_stage_state)
    tracker = Tracker(log_cfg, start_step=global_step, run_name=run_name, config=run_config)
    bar = progress(
        plan.total, global_step, desc, log_cfg.disable_progress_bar, log_cfg.log_interval
    )
    engine.train()
    preemption.enter_training()

    def checkpoint(step: int, path: Path | None, final: bool) -> None:
        if final:  # the run directory itself (it holds train_state/ and the logs too)
            save_model(step, path, final)
        elif path is not None:  # checkpoints/step-N appears whole (written aside, then renamed)
            with staged_directory(path) as where:
                save_model(step, where, final)
        client = {"global_step": step, "rng": rng_state()}
        if stage_state is not None:
            client["stage"] = stage_state()
        extra = {"model": {SETTINGS_FILE: settings_writer(settings)}} if settings else None
        save_train_state(
            {"model": engine}, state_root, step, client, log_cfg.keep_checkpoints, extra
        )

    spe, total = plan.steps_per_epoch, plan.total
    while global_step < total:
        epoch, step_in_epoch = divmod(global_step, spe)
        perm = epoch_permutation(n_train, seed, epoch)
        lr = engine.get_lr()[0]  # the rate this step is taken with (read before engine.step())
        t0 = time.perf_counter()
        micro_batches = step_micro_batches(
            perm, step_in_epoch, plan.micro, plan.accumulation, plan.world, rank()
        )
        metrics = train_step(micro_batches, global_step)
        startup.first_step(logger)
        global_step += 1
        bar.update(1)
        shown = {k: f"{metrics[m]:{fmt}}" for k, (m, fmt) in _BAR_FIELDS.items() if m in metrics}
        bar.set_postfix(**shown, epoch=epoch)
        if global_step % log_cfg.log_interval == 0 or global_step == total:
            metrics = {**metrics, "train/step_time_s": time.perf_counter() - t0, "lr": lr}
            metrics["train/epoch"] = epoch + (step_in_epoch + 1) / spe
            tracker.log(metrics, global_step)
        if _eval_due(log_cfg, global_step, spe, total):
            log_eval(evaluate(), global_step, tracker, logger)
        saved = log_cfg.save_steps and global_step % log_cfg.save_steps == 0
        if saved and global_step < total:
            checkpoint(global_step, out / "checkpoints" / f"step-{global_step}", final=False)
        if global_step < total:  # SIGTERM / SIGINT on any rank: checkpoint, then stop
            _stop_if_requested(global_step, total, saved, checkpoint, (bar, tracker), state_root)
    bar.close()
    checkpoint(global_step, out, final=True)  # the final model is the run directory itself
    tracker.close()
    return global_step


# --------------------------------------------------------------------------------------------------
# the supervised stages' set-up (SFT, reward model)


@dataclass
class SupervisedSetup:
    """A supervised stage's run once set up (:func:`setup_supervised`): what its steps,
    evaluations and saves share, and :meth:`loop` to train it."""

    cfg: SupervisedConfig  # the stage's config
    name: str  # the run's name in the log and the trackers ("SFT", "RM (end)")
    logger: logging.Logger
    out: Path  # the output directory, locked for this run
    tokenizer: Any  # pads on the right
    train_ds: Any
    eval_ds: Any
    plan: StepPlan
    settings: dict  # this run's settings (check_resume), saved with every training state
    engine: Any  # the trained model's DeepSpeed engine
    ds_json: dict  # its DeepSpeed config, saved next to every model
    run_config: dict  # the resolved flags, saved next to every model

    def loop(self, desc: str, **stage: Callable) -> int:
        """:func:`supervised_loop` over this run (``desc``: the progress bar's label) with the
        stage's ``train_step``, ``evaluate`` and ``save_model`` (and, if it has state of its own,
        ``stage_state`` and ``load_stage_state``)."""
        return supervised_loop(
            self.engine, self.plan, self.cfg.log, n_train=len(self.train_ds),
            seed=self.cfg.optim.seed, desc=desc, logger=self.logger, settings=self.settings,
            run_name=self.name, run_config=self.run_config, **stage,
        )  # fmt: skip


def setup_supervised(
    cfg: SupervisedConfig,
    *,
    name: str,
    logger: logging.Logger,
    models: dict[str, str],
    build_dataset: Callable[[Any, Any, str, int], Any],
    check_data: Callable[[Any, Any], None] | None = None,
    split: str,
    unit: str,
    build_model: Callable[[], torch.nn.Module],
) -> SupervisedSetup:
    """Set up the run of a supervised stage (its config ``cfg``), in the order each such stage
    takes:

    1. the process group and seeds (:func:`start`), the output directory locked for this run
       (:func:`ensure_output_dir`);
    2. the tokenizer (right padding); the ``models`` (flag -> model name, an empty name skipped)
       checked against ``--max_seq_len`` (:func:`marlhf.models.context.check_context`);
    3. the train and eval splits, ``build_dataset(cfg.data, tokenizer, split, seed)``, checked by
       ``check_data(train, eval)`` when given;
    4. the step plan (:func:`plan_steps`: ``split`` and ``unit`` name the rows in its error) and
       this run's settings, checked against those of the checkpoint it resumes from before any
       model loads (:func:`check_resume`);
    5. the model, ``build_model()``, and its DeepSpeed engine;
    6. ``run_config.json`` and ``ds_config.json`` in the output directory (:func:`write_run_config`)
       and, on rank 0, one line: ``name``, the splits' sizes in ``unit``, the steps.

    The start-up phases (:mod:`marlhf.runtime.startup`) ``data``, ``model`` and ``engine`` end
    after the splits, the model and the engine.
    """
    start(cfg.ds, cfg.optim.seed, progress_bars=not cfg.log.disable_progress_bar)
    out = ensure_output_dir(cfg.log.output_dir)
    tokenizer = load_tokenizer(cfg.model, padding_side="right")
    check_context(models, {"--max_seq_len": cfg.data.max_seq_len})
    train_ds = build_dataset(cfg.data, tokenizer, "train", cfg.optim.seed)
    eval_ds = build_dataset(cfg.data, tokenizer, "eval", cfg.optim.seed)
    if check_data is not None:
        check_data(train_ds, eval_ds)
    startup.mark("data")
    plan = plan_steps(len(train_ds), cfg.optim, split, unit)
    settings = check_resume(cfg, cfg.log, {"global_batch": plan.global_batch})
    model = build_model()
    startup.mark("model")
    engine, ds_json = build_train_engine(
        model,
        model_cfg=cfg.model,
        ds=cfg.ds,
        optim=cfg.optim,
        total_steps=plan.total,
        micro_batch_size=plan.micro,
    )
    startup.mark("engine")
    run_config = write_run_config(out, cfg, ds_json)
    if is_main():
        logger.info(
            "%s: %d train / %d eval %s, %d steps/epoch, %d steps",
            name, len(train_ds), len(eval_ds), unit, plan.steps_per_epoch, plan.total,
        )  # fmt: skip
    return SupervisedSetup(
        cfg, name, logger, out, tokenizer, train_ds, eval_ds, plan, settings, engine, ds_json,
        run_config,
    )  # fmt: skip
