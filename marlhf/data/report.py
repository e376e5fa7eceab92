"""Where a phase's rows went: counts from the files to the tokenised set, and the error of an empty set.

Every tokenised set (``marlhf.data.tokenize``) is built from ``--data_path`` entries through four
filters: the rows of the files, those of the split (a ``split`` field, the file names of a directory,
or the deterministic 95/5 carve), those that become examples (bad rows skipped with
``--skip_bad_rows``, WebGPT ties with ``--webgpt_skip_ties``), those of the phase (``--data_split``),
and those the builder keeps (a chosen response for SFT, a real preference for pairs, a prompt that
fits for PPO). When nothing is left, ``empty_set_error`` says at which filter the rows ran out and
what to change, instead of an ``IndexError`` deep inside ``datasets``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marlhf.data.schema import DataError

PHASE_NAMES = {1: "SFT", 2: "reward-model", 3: "PPO"}


@dataclass
class SourceCounts:
    """How one ``--data_path`` entry's rows became the examples of one split."""

    spec: str
    files: list[str] = field(default_factory=list)
    rows_read: int = 0  # rows in the files read (bad lines included)
    in_split: int = 0  # rows that belong to the split (checked before --max_samples stops reading)
    bad: int = 0  # malformed rows skipped (--skip_bad_rows)
    by_design: int = 0  # rows the adapter skips on purpose (WebGPT ties, --webgpt_skip_ties)
    examples: int = 0
    in_phase: int = 0
    carve_min_rows: int = 0  # > 0: the split came from the 95/5 carve, which needs this many rows
    capped: bool = False  # reading stopped at --max_samples

    def describe(self, split: str, phase: int, data_split: str) -> str:
        where = "" if self.files in ([], [self.spec]) else " from " + ", ".join(self.files)
        parts = [f"{self.rows_read} rows read{where}"]
        if self.bad:
            parts.append(f"{self.bad} bad rows skipped (--skip_bad_rows)")
        how = " (95/5 carve)" if self.carve_min_rows else ""
        parts.append(f"{self.in_split} in the {split} split{how}")
        if self.by_design:
            parts.append(f"{self.by_design} ties skipped (--webgpt_skip_ties)")
        capped = " (--max_samples)" if self.capped else ""
        parts.append(f"{self.examples} examples{capped}")
        parts.append(f"{self.in_phase} in phase {phase} (--data_split {data_split})")
        return f"--data_path {self.spec}: " + "; ".join(parts)


@dataclass
class PhaseReport:
    """Counts of one tokenised set: per ``--data_path`` entry, then the builder's drops by reason."""

    sources: list[SourceCounts] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # reason (plural noun phrase) -> count
    fixes: dict[str, str] = field(default_factory=dict)  # reason -> what to do about it

    def drop(self, reason: str, n: int = 1, fix: str = "fix the data") -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n
            self.fixes[reason] = fix


def _phase_weight(data_split: str, phase: int) -> float:
    return float(data_split.split(",")[phase - 1])


def _hint(report: PhaseReport, split: str, phase: int, data_split: str) -> str:
    """What to change, for the first filter at which no row was left."""
    src = report.sources
    if sum(s.rows_read for s in src) == 0:
        return "the data has no rows: add rows to the file(s) given in --data_path"
    if sum(s.in_split for s in src) == 0:
        carved = [s for s in src if s.carve_min_rows]
        if carved and split == "eval":
            need = carved[0].carve_min_rows
            return (
                f"a file without eval rows gives 5 % of its rows to eval (rounded), so it needs at "
                f"least {need} rows for one: add rows, or pass a directory holding train*.jsonl and "
                "valid*.jsonl (or test*) files"
            )
        return (
            f"no row belongs to the {split} split: check the rows' `split` field (train*, valid*) "
            "or the file names of the --data_path directory (train*, valid*/eval*/dev*/test*)"
        )
    if sum(s.examples for s in src) == 0:
        return (
            "every row of the split was skipped: fix the data (run without --skip_bad_rows to see "
            "the first bad row; without --webgpt_skip_ties to keep ties)"
        )
    if sum(s.in_phase for s in src) == 0:
        if _phase_weight(data_split, phase) == 0:
            return (
                f"phase {phase} ({PHASE_NAMES[phase]}) has weight 0 in --data_split {data_split}: "
                "give it a positive weight (e.g. --data_split 2,4,4)"
            )
        n = sum(s.examples for s in src)
        return (
            f"phase {phase}'s share of {n} examples under --data_split {data_split} rounds to 0: "
            "add rows or raise its weight"
        )
    reason = max(report.dropped, key=report.dropped.get)
    return f"every example was dropped ({reason}): {report.fixes[reason]}"


def empty_set_error(report: PhaseReport, what: str, split: str, phase: int, data_split: str):
    """The ``DataError`` for a tokenised set with no rows (``what``: "SFT examples", ...)."""
    lines = [
        f"no {split} {what} for phase {phase} ({PHASE_NAMES[phase]}): the set would be empty, "
        "and an empty set is never cached"
    ]
    lines += ["  " + s.describe(split, phase, data_split) for s in report.sources]
    if report.dropped:
        drops = ", ".join(f"{n} {reason}" for reason, n in report.dropped.items())
        lines.append(f"  dropped while building: {drops}")
    lines.append("What to do: " + _hint(report, split, phase, data_split))
    return DataError("\n".join(lines))
