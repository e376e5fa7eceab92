"""The result file: the settings sidecar that guards resuming, appending rows durably, reading them
back (a half-written last line is cut off), and the summary of a finished file."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

from marlhf.data.readers import json_lines
from marlhf.inference.config import InferenceConfig
from marlhf.inference.naming import dataset_spec, sidecar
from marlhf.macro.config import MacroConfig
from marlhf.rewards.code import CodeRewardConfig, pass_at_k

log = logging.getLogger("marlhf.inference")  # one logger name for the whole program

_FREE_SETTINGS = frozenset(
    {
        "num_samples",
        "batch_size",
        "gpu",
        "output",
        "overwrite",
        "render_macro",
        "max_batches",
        "disable_progress_bar",
        "pass_k",
        "proj_path",
        "skip_bad_rows",
        "save_token_ids",
    }
)


def repair_tail(path: str) -> int:
    """Cut a half-written last line (a run killed mid-write); returns the bytes removed."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        f.seek(0)
        data = f.read()
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    log.warning("%s: removed a half-written last line (%d bytes)", path, size - keep)
    return size - keep


def read_rows(path: str) -> list[dict]:
    """The complete rows of a result file (ValueError naming the line for a corrupt one)."""
    rows: list[dict] = []
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as f:
        complete = itertools.takewhile(
            lambda line: line.endswith("\n"), f
        )  # not a half-written last
        for lineno, row in json_lines(complete, path, ValueError):
            if not isinstance(row, dict) or "prompt_id" not in row:
                raise ValueError(f'{path} line {lineno}: field "prompt_id" missing')
            rows.append(row)
    return rows


def run_settings(
    cfg: InferenceConfig, macro: MacroConfig, code: CodeRewardConfig, backend: str = "hf"
) -> dict:
    """What the rows of an output depend on (compared with the sidecar when resuming). The
    sampling flags go under the names the result files use (``max_new_tokens``,
    ``max_prompt_len``, ``temperature``, ...); ``backend``, the resolved ``--generation_backend``,
    is recorded unless it is ``hf`` and ``--data_columns`` unless it is empty, so that a file
    sampled with ``hf`` from a dataset's own columns keeps the settings it was written with."""
    free = _FREE_SETTINGS | {"sampling", "data"}
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in free}
    if not settings.get("apply_chat_template"):  # off: the settings of files written before it
        settings.pop("apply_chat_template", None)
    s = cfg.sampling
    settings.update(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        max_new_tokens=s.max_answer_seq_len,
        max_prompt_len=s.max_prompt_seq_len,
    )
    if backend != "hf":
        settings["generation_backend"] = backend
    if cfg.data.data_columns:
        settings["data_columns"] = list(cfg.data.data_columns)
    settings["dataset_spec"] = dataset_spec(cfg.dataset)
    settings["model_path"] = os.path.abspath(cfg.model) if os.path.exists(cfg.model) else cfg.model
    if cfg.reward_model:
        settings["reward_model_path"] = os.path.abspath(cfg.reward_model)
    if cfg.n_samples_per_prompt > 1 or dataset_spec(cfg.dataset) == "codeparrot/apps":
        settings["code"] = dataclasses.asdict(code)
    return json.loads(json.dumps(settings))


def prepare_output(path: str, settings: dict, overwrite: bool) -> set[str]:
    """Check/write ``<path>.meta.json`` and return the prompt ids already written.

    Raises ValueError when the sidecar's settings differ from ``settings`` and rows were written
    under them (unless ``overwrite``, which deletes the output and its sidecars first); with no row
    written yet (an earlier run failed before its first batch) the new settings replace the old.
    """
    meta_path = sidecar(path, "meta")
    if overwrite:
        for p in (path, meta_path, sidecar(path, "summary")):
            if os.path.exists(p):
                os.remove(p)
    if os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f).get("settings", {})
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff and not _has_rows(path):
            log.info("%s: no rows written under the old settings; replacing them", meta_path)
        elif diff:
            detail = ", ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in diff[:6])
            raise ValueError(
                f"{path} was written with other settings ({detail}); refusing to mix results. "
                "Pass --overwrite to start afresh or --output for another file."
            )
    elif os.path.exists(path) and os.path.getsize(path) > 0:
        raise ValueError(
            f"{path} exists without its {os.path.basename(meta_path)}; refusing to append to it "
            "(pass --overwrite)"
        )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump({"settings": settings}, f, indent=2, sort_keys=True)
        f.write("\n")
    repair_tail(path)
    return {r["prompt_id"] for r in read_rows(path)}


def _has_rows(path: str) -> bool:
    """Whether ``path`` holds at least one complete row (a half-written line is not one)."""
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as f:
        return any(line.strip() and line.endswith("\n") for line in f)


def append_rows(path: str, rows: list[dict]) -> None:
    """Append rows and make them durable (flush + fsync): a kill loses at most the current batch."""
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return mean, math.sqrt(var)


def summarize(rows: list[dict], pass_k: Sequence[int] = ()) -> dict:
    """Summary of a result file: n, reward mean/std (sample std), mean response length, EOS rate,
    mean gold when rows carry it; with ``--ref-scores`` rows the chosen/rejected means and the RM's
    accuracy (chosen > rejected); with APPS rows unbiased pass@k averaged over problems."""
    out: dict[str, Any] = {"n": len(rows)}
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    out["reward_mean"], out["reward_std"] = _mean_std(rewards)
    lengths = [r["response_tokens"] for r in rows if "response_tokens" in r]
    out["response_tokens_mean"] = sum(lengths) / len(lengths) if lengths else None
    eos = [float(r["ends_with_eos"]) for r in rows if "ends_with_eos" in r]
    out["eos_rate"] = sum(eos) / len(eos) if eos else None
    golds = [float(r["gold"]) for r in rows if r.get("gold") is not None]
    if golds:
        out["gold_mean"], out["gold_std"] = _mean_std(golds)
    pairs = [
        r
        for r in rows
        if r.get("rejected_reward") is not None and r.get("chosen_reward") is not None
    ]
    if pairs:
        out["chosen_reward_mean"] = sum(r["chosen_reward"] for r in pairs) / len(pairs)
        out["rejected_reward_mean"] = sum(r["rejected_reward"] for r in pairs) / len(pairs)
        out["accuracy"] = sum(r["chosen_reward"] > r["rejected_reward"] for r in pairs) / len(pairs)
    code = [r for r in rows if "n_correct" in r]
    if code:
        for k in pass_k:
            usable = [r for r in code if len(r["rewards"]) >= k]
            if usable:
                out[f"pass@{k}"] = sum(
                    pass_at_k(len(r["rewards"]), r["n_correct"], k) for r in usable
                ) / len(usable)
    return out
