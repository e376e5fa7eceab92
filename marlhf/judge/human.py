"""Blind pairwise human evaluation in the terminal (``evaluation/human-eval.py``).

The two result files are aligned as for the LLM judge; ``--num`` prompts are chosen and each item's
A/B order is drawn from ``random.Random(--seed)``, both depending only on the set of prompts and the seed,
so a re-run shows the same items in the same order. Keys: ``1`` = A better, ``2`` = B better, ``3`` =
tie, ``4`` = skip, ``q`` = quit. On a terminal one keypress answers; from a pipe one line per answer.
Each answer is appended to ``--output`` and flushed at once; a re-run skips the items already answered
(skipped ones included), so an evaluation can be spread over sessions. At the end (or on ``q``) the
answers are mapped back from positions to models and summarised like the judge
(:func:`marlhf.judge.summarize`, skips counted as invalid), also written to
``<output>.summary.json``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from marlhf.cli import parse_config
from marlhf.config import flag
from marlhf.judge.outcomes import format_summary, n_words, summarize
from marlhf.judge.pairing import (
    Pair,
    PairingError,
    align_results,
    output_overwrites,
    result_file_field,
)

KEYS = {"1": "A", "2": "B", "3": "tie", "4": "skip"}


@dataclass
class HumanEvalConfig:
    """Blind pairwise human evaluation of two result files."""

    model_name_a: str = result_file_field("a")
    model_name_b: str = result_file_field("b")
    output: str = flag(help="Answers JSONL (appended; re-running resumes).")
    seed: int = flag(42, "Seed of item choice and A/B order.")
    num: int = flag(50, "Number of items to judge.")

    def __post_init__(self) -> None:
        if self.num < 1:
            raise ValueError(f"--num must be >= 1, got {self.num}")


@dataclass
class HumanEvalStage:
    """Judge two models' answers to the same prompts yourself, blind, in the terminal."""

    human: HumanEvalConfig


@dataclass
class PlannedItem:
    """One item to show: the pair and which model is shown first (as A)."""

    pair: Pair
    shown_first: str  # 'a' or 'b'


def plan(pairs: Sequence[Pair], num: int, seed: int) -> list[PlannedItem]:
    """Choose ``num`` pairs and their A/B order; depends only on the pair keys and ``seed``."""
    rng = random.Random(seed)
    ordered = sorted(pairs, key=lambda p: p.key)
    rng.shuffle(ordered)
    chosen = ordered[:num]
    return [PlannedItem(p, "a" if rng.random() < 0.5 else "b") for p in chosen]


def outcome_of(choice: str, shown_first: str) -> str:
    """Model outcome ('a', 'b', 'tie', 'skip') of a position choice ('A', 'B', 'tie', 'skip')."""
    if choice in ("tie", "skip"):
        return choice
    return shown_first if choice == "A" else ("b" if shown_first == "a" else "a")


class KeyReader:
    """One answer at a time: a single keypress on a terminal, else one stripped line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        try:
            self.tty = stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def read(self) -> str | None:
        """The next key, or None at end of input."""
        if not self.tty:
            line = self.stream.readline()
            return None if line == "" else line.strip().lower()
        import termios
        import tty

        fd = self.stream.fileno()
        old = termios.tcgetattr(fd)
        try:
            tty.setcbreak(fd, termios.TCSANOW)  # TCSANOW keeps keys typed ahead
            ch = os.read(fd, 1).decode(errors="replace")
        finally:
            termios.tcsetattr(fd, termios.TCSANOW, old)
        if ch in ("", "\x04"):
            return None
        if ch == "\x03":
            return "q"
        return ch.lower()


def load_answers(path: Path) -> list[dict]:
    """Answers already in ``path`` (a torn last line from a crash is ignored)."""
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "key" in rec and "outcome" in rec:
                out.append(rec)
    return out


def summarize_answers(answers: Sequence[dict], seed: int = 0) -> dict:
    """Judge-style summary of answers (model outcomes; skips counted as invalid)."""
    outcomes = ["invalid" if a["outcome"] == "skip" else a["outcome"] for a in answers]
    len_a = [n_words(a["response_a"]) for a in answers]
    len_b = [n_words(a["response_b"]) for a in answers]
    s = summarize(outcomes, len_a, len_b, seed=seed)
    s["skipped"] = sum(a["outcome"] == "skip" for a in answers)
    s["outcome_rule"] = "one human answer per item, shown in a random A/B order; skips are invalid"
    return s


def run_human_eval(
    cfg: HumanEvalConfig, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> dict:
    """Run the interactive loop (module doc); returns the summary of all answers so far."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout

    problem = output_overwrites(
        cfg.output, {"--model_name_a": cfg.model_name_a, "--model_name_b": cfg.model_name_b}
    )
    if problem:
        raise PairingError(problem)
    pairs = align_results(
        cfg.model_name_a, cfg.model_name_b, on_note=lambda m: print(m, file=stdout)
    )
    items = plan(pairs, cfg.num, cfg.seed)
    out_path = Path(cfg.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    answers = load_answers(out_path)
    answered = {a["key"] for a in answers}
    todo = [(k, it) for k, it in enumerate(items, 1) if it.pair.key not in answered]
    if len(items) < cfg.num:
        print(f"note: only {len(items)} aligned prompts (asked for {cfg.num})", file=stdout)
    if answered:
        print(
            f"resuming: {len(items) - len(todo)} of {len(items)} items already answered",
            file=stdout,
        )
    reader = KeyReader(stdin)
    bar = "=" * 72
    with open(out_path, "a", encoding="utf-8") as fh:
        for k, it in todo:
            p = it.pair
            first, second = (
                (p.response_a, p.response_b)
                if it.shown_first == "a"
                else (p.response_b, p.response_a)
            )
            print(f"\n{bar}\nitem {k}/{len(items)}\n{bar}", file=stdout)
            print(
                f"[Prompt]\n{p.prompt.strip()}\n\n[A]\n{first.strip()}\n\n[B]\n{second.strip()}\n",
                file=stdout,
            )
            choice = None
            while choice is None:
                print(
                    "Which is better? 1 = A, 2 = B, 3 = tie, 4 = skip, q = quit: ",
                    end="",
                    file=stdout,
                )
                stdout.flush()
                key = reader.read()
                if reader.tty and key is not None:
                    print(key, file=stdout)
                if key is None or key == "q":
                    print("\nstopped; answers so far are saved, re-run to continue", file=stdout)
                    return _finish(cfg, out_path, stdout)
                choice = KEYS.get(key)
                if choice is None:
                    print(f"unknown key {key!r}: press 1, 2, 3, 4 or q", file=stdout)
            rec = {
                "key": p.key,
                "prompt_id": p.prompt_id,
                "item": k,
                "prompt": p.prompt,
                "response_a": p.response_a,
                "response_b": p.response_b,
                "shown_first": it.shown_first,
                "choice": choice,
                "outcome": outcome_of(choice, it.shown_first),
                "seed": cfg.seed,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    print("\nall items answered", file=stdout)
    return _finish(cfg, out_path, stdout)


def _finish(cfg: HumanEvalConfig, out_path: Path, stdout: TextIO) -> dict:
    answers = load_answers(out_path)
    s = summarize_answers(answers, seed=cfg.seed)
    s.update({"model_a": str(cfg.model_name_a), "model_b": str(cfg.model_name_b), "seed": cfg.seed})
    s["num"] = cfg.num
    summary_path = out_path.with_name(out_path.name + ".summary.json")
    summary_path.write_text(json.dumps(s, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(format_summary(s, "a", "b"), file=stdout)
    print(f"skipped={s['skipped']}\na = {cfg.model_name_a}\nb = {cfg.model_name_b}", file=stdout)
    print(f"wrote {out_path} and {summary_path.name}", file=stdout)
    return s


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point of ``evaluation/human-eval.py``."""
    cfg = parse_config(HumanEvalStage, argv).human
    try:
        run_human_eval(cfg)
    except PairingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
