"""The runs of a comparison (``marlhf compare``): each run's curves from its ``metrics.jsonl``, what ran
(its ``run_config.json``), and the runs grouped into arms.

A row or value that cannot be used is left out with a warning naming the file and its lines: a line
that is not JSON (a half-written last line: a run still going), a row without an integer ``step``,
a reported metric that is NaN, infinite or ``null`` (the tracker's non-finite value) or not a number.
A complete last row without its newline counts. A run given twice counts once, a run without any
row is left out, a seed that stops earlier than the others of its arm and an arm pooling runs of
different settings are warned about.

Without labels, runs are grouped by what ran: the stage and its flags but for the seeds, paths and
logging (:func:`settings_of`); an arm is named after the run (``PPO``, ``MA-PPO n=5``, ``SFT``,
``RM (end)``) and, where runs of one name differ, after the flags in which they do
(``PPO, learning_rate=1e-05``); a run without ``run_config.json`` after its directory.
"""

from __future__ import annotations

import glob
import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlhf.cli import config_from_dict, flag_values
from marlhf.runtime.run_settings import HARMLESS
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.ppo.naming import run_label
from marlhf.stages.reward.config import RewardStageConfig
from marlhf.stages.sft.config import SFTConfig

Warn = Callable[[str], None]


def _lines(numbers: Sequence[int]) -> str:
    """``line 3`` / ``lines 3, 7, 9`` / ``lines 3, 7, 9, 12, 15 and 40 more``."""
    shown = ", ".join(map(str, numbers[:5]))
    more = f" and {len(numbers) - 5} more" if len(numbers) > 5 else ""
    return f"line{'s' * (len(numbers) > 1)} {shown}{more}"


def read_series(path: Path, watched: Collection[str], warn: Warn) -> dict[str, dict[int, float]]:
    """``metric -> {step: value}`` of a ``metrics.jsonl`` (the last value logged per step), every
    finite number kept; the rows and ``watched`` values left out are warned about, by file and
    line."""
    data = path.read_bytes()
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()  # the newline ending the last line
    torn = not data.endswith(b"\n")
    series: dict[str, dict[int, float]] = {}
    problems: dict[str, list[int]] = {}  # what was left out -> lines

    def left_out(what: str, lineno: int) -> None:
        problems.setdefault(what, []).append(lineno)

    for lineno, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            last = torn and lineno == len(raw)
            left_out(
                "a half-written last line (a run still going?)" if last else "not JSON", lineno
            )
            continue
        if not isinstance(row, dict):
            left_out("not a JSON object", lineno)
            continue
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            left_out('no integer "step"', lineno)
            continue
        for key, value in row.items():
            if key in ("step", "time"):
                continue
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value):
                series.setdefault(key, {})[step] = float(value)
            elif key in watched:
                what = (
                    "non-finite (NaN, inf or null)" if number or value is None else "not a number"
                )
                left_out(f"{key} {what}", lineno)
    for what, numbers in problems.items():
        warn(f"{path} {_lines(numbers)}: {what}; left out")
    return series


# flags that may differ between the seeds of one arm: seeds, paths, logging and how a step is
# computed (run_settings.HARMLESS)
def _free(flag: str) -> bool:
    return flag in HARMLESS or flag.endswith(("seed", "name_or_path"))


def what_ran(path: Path, warn: Warn) -> tuple[str, dict[str, Any] | None, dict[str, Any]]:
    """The run's name (stage 3's ``PPO``, ``MA-PPO n=5``, ``GRPO``...; ``SFT``; ``RM (end)``),
    the flags that make it what it is (:func:`settings_of`) and its seeds (the flags named
    ``*seed``), from its ``run_config.json``; the directory's name, None and {} without one."""
    cfg_file = path / "run_config.json"
    if not cfg_file.exists():
        return path.name, None, {}
    try:
        data = json.loads(cfg_file.read_text(encoding="utf-8"))
        if "ppo" in data:
            cfg: Any = config_from_dict(PPOStageConfig, data)
            name = run_label(cfg)
        elif "reward" in data:
            cfg = config_from_dict(RewardStageConfig, data)
            name = f"RM ({cfg.reward.rm_type})"
        else:
            cfg = config_from_dict(SFTConfig, data)
            name = "SFT"
        seeds = {k: v for k, v in flag_values(cfg).items() if k.endswith("seed")}
        return name, settings_of(cfg), seeds
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as err:
        warn(f"{cfg_file}: not a run configuration ({err}); the run is named after its directory")
        return path.name, None, {}


def settings_of(cfg: Any) -> dict[str, Any]:
    """The flags of a stage config but those seeds of one arm may differ in (seeds, model and
    data paths' names, logging)."""
    return {k: v for k, v in flag_values(cfg).items() if not _free(k)}


def differing(settings: Sequence[dict[str, Any]]) -> list[str]:
    """The flags whose value is not the same in all ``settings``."""
    keys = sorted(set().union(*settings))
    return [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1]


@dataclass
class Run:
    """One run: its directory, ``metric -> {step: value}``, its name, settings and seeds (what
    ran)."""

    path: Path
    series: dict[str, dict[int, float]]
    name: str = ""
    settings: dict[str, Any] | None = None
    seeds: dict[str, Any] = field(default_factory=dict)

    @property
    def last_step(self) -> int | None:
        return max((max(s) for s in self.series.values() if s), default=None)


def load_run(path: Path, watched: Collection[str] = (), warn: Warn | None = None) -> Run:
    """A run directory's curves and what ran (ValueError without a ``metrics.jsonl``)."""
    warn = warn or (lambda _: None)
    f = path / "metrics.jsonl"
    if not f.exists():
        raise ValueError(f"{path}: no metrics.jsonl (is it a run directory?)")
    name, settings, seeds = what_ran(path, warn)
    return Run(path, read_series(f, watched, warn), name, settings, seeds)


def arm_name(path: Path) -> str:
    """What ran (stage 3's ``PPO``, ``MA-PPO n=5``, ``GRPO``...; ``SFT``; ``RM (end)``), else the
    directory's name."""
    return what_ran(path, lambda _: None)[0]


def expand(patterns: Sequence[str], warn: Warn | None = None) -> list[list[Path]]:
    """The run directories of each pattern (a directory or a glob), each directory once (a second
    mention is warned about and dropped); ValueError for a pattern that matches none."""
    out, seen = [], {}
    for p in patterns:
        found = sorted(Path(x) for x in glob.glob(p)) if any(c in p for c in "*?[") else [Path(p)]
        found = [f for f in found if f.is_dir()]
        if not found:
            raise ValueError(f"{p}: no run directory")
        kept = []
        for f in found:
            key = f.resolve()
            if key in seen:
                if warn:
                    warn(f"{f}: given twice (as {seen[key]} too); counted once")
                continue
            seen[key] = f
            kept.append(f)
        out.append(kept)
    return out


@dataclass
class _Group:
    name: str
    settings: dict[str, Any] | None
    runs: list[Run] = field(default_factory=list)


def _by_what_ran(runs: Sequence[Run]) -> list[_Group]:
    """Runs grouped by name and settings, in the order first seen; groups of one name named after
    the flags in which they differ."""
    groups: list[_Group] = []
    for run in runs:
        same = (g for g in groups if g.name == run.name and g.settings == run.settings)
        group = next(same, None)
        if group is None:
            group = _Group(run.name, run.settings)
            groups.append(group)
        group.runs.append(run)
    for name in {g.name for g in groups}:
        twins = [g for g in groups if g.name == name]
        if len(twins) < 2:
            continue
        known = [g.settings for g in twins if g.settings is not None]
        keys = differing(known) if len(known) > 1 else []
        for g in twins:
            if g.settings is None or not keys:
                g.name = f"{name} ({g.runs[0].path})"
            else:
                shown = ", ".join(f"{k}={g.settings.get(k)}" for k in keys[:3])
                g.name = f"{name}, {shown}{', ...' if len(keys) > 3 else ''}"
    return groups


def arms_of(
    patterns: Sequence[str],
    labels: Sequence[str],
    watched: Collection[str] = (),
    warn: Warn | None = None,
) -> dict[str, list[Run]]:
    """``arm name -> runs`` (the seeds of an arm), in the order first seen.

    Labels name the RUN arguments, one each (a glob's runs share one); or, when their number is
    not that of the RUN arguments (a glob the shell expanded), the arms the runs make without
    labels, in order. Runs without any row are left out; an arm whose seeds stop at different
    steps or differ in settings is warned about."""
    warn = warn or (lambda _: None)
    runs_of = [[load_run(p, watched, warn) for p in paths] for paths in expand(patterns, warn)]
    for run in (r for runs in runs_of for r in runs):
        if not run.series:
            warn(f"{run.path / 'metrics.jsonl'}: no complete row; the run is left out")
    runs_of = [[r for r in runs if r.series] for runs in runs_of]
    groups = _by_what_ran([r for runs in runs_of for r in runs])
    arms: dict[str, list[Run]] = {}
    if not labels:
        arms = {g.name: g.runs for g in groups}
    elif len(labels) == len(patterns):
        for label, runs in zip(labels, runs_of, strict=True):
            arms.setdefault(label, []).extend(runs)
    elif len(labels) == len(groups):
        arms = {label: g.runs for label, g in zip(labels, groups, strict=True)}
    else:
        kinds = "; ".join(f"{g.name}: {len(g.runs)} run{'s' * (len(g.runs) > 1)}" for g in groups)
        raise ValueError(
            f"--label: {len(labels)} labels for {len(patterns)} RUN arguments, which make "
            f"{len(groups)} arms ({kinds}); give one label per RUN argument or per arm, and quote "
            "a glob ('out/ppo_s*') to keep the shell from expanding it"
        )
    for name, runs in arms.items():
        _check_arm(name, runs, warn)
    return {name: runs for name, runs in arms.items() if runs}


def _check_arm(name: str, runs: Sequence[Run], warn: Warn) -> None:
    """Warn about seeds that stop earlier than the others, runs of different settings and runs
    of the same settings and seeds (one seed twice: no spread to measure)."""
    if not runs:
        warn(f"arm {name}: no run with a complete row; left out")
        return
    last = max(r.last_step for r in runs)
    for r in runs:
        if r.last_step < last:
            warn(
                f"arm {name}: {r.path} logged up to step {r.last_step}, another seed up to step "
                f"{last} (crashed or still running?); the arm's curves stop at step "
                f"{r.last_step} and its final values come from different steps"
            )
    known = [r for r in runs if r.settings is not None]
    keys = differing([r.settings for r in known]) if len(known) > 1 else []
    if keys:
        values = "; ".join(
            f"{k}: " + ", ".join(str(r.settings.get(k)) for r in known) for k in keys[:4]
        )
        more = f" and {len(keys) - 4} more flags" if len(keys) > 4 else ""
        runs_text = ", ".join(str(r.path) for r in known)
        warn(f"arm {name} pools runs of different settings ({runs_text}): {values}{more}")
    first: dict[str, Path] = {}
    for r in known:
        key = json.dumps([r.settings, r.seeds], sort_keys=True, default=str)
        if key in first:
            seeds = ", ".join(f"{k}={v}" for k, v in r.seeds.items())
            warn(
                f"arm {name}: {first[key]} and {r.path} ran the same settings and seeds ({seeds}): "
                "one seed twice, not two seeds"
            )
        first.setdefault(key, r.path)
