"""Summary statistics of pairwise outcomes, from model a's point of view.

Outcomes are ``'a'`` (a wins), ``'b'`` (a loses), ``'tie'`` and ``'invalid'`` (unparseable, failed or
skipped). **Win rate counts a tie as half a win** and leaves invalid items out:
``win_rate = (wins + ties / 2) / (wins + ties + losses)``. Its 95 % interval is a percentile bootstrap
over the valid items (scores 1, 1/2, 0) with a seeded ``random.Random``.

Length control: judges favour longer answers, so we also report the mean length (whitespace words) of
each side and the win rate restricted to *length-matched* pairs, those whose lengths differ by at most
``tolerance`` (10 %) of the longer one. A win rate that holds up on matched pairs is not a length effect.

>>> s = summarize(["a", "a", "tie", "b", "invalid"], seed=0, n_boot=200)
>>> (s["wins"], s["ties"], s["losses"], s["invalid"], s["win_rate"])
(2, 1, 1, 1, 0.625)
"""

from __future__ import annotations

from collections.abc import Sequence

from marlhf.stats import bootstrap_mean_ci

_SCORE = {"a": 1.0, "tie": 0.5, "b": 0.0}


def counts(outcomes: Sequence[str]) -> dict[str, int]:
    """Wins, ties, losses, invalid and total n."""
    bad = sorted({o for o in outcomes if o not in ("a", "b", "tie", "invalid")})
    if bad:
        raise ValueError(f"unknown outcomes {bad}; expected a, b, tie, invalid")
    return {
        "n": len(outcomes),
        "wins": sum(o == "a" for o in outcomes),
        "ties": sum(o == "tie" for o in outcomes),
        "losses": sum(o == "b" for o in outcomes),
        "invalid": sum(o == "invalid" for o in outcomes),
    }


def win_rate(outcomes: Sequence[str]) -> float | None:
    """Ties count half; invalid excluded; None if no valid item."""
    scores = [_SCORE[o] for o in outcomes if o in _SCORE]
    return sum(scores) / len(scores) if scores else None


def bootstrap_ci(
    outcomes: Sequence[str], *, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap ``(low, high)`` of :func:`win_rate` over valid items; None if none valid."""
    scores = [_SCORE[o] for o in outcomes if o in _SCORE]
    if not scores:
        return None
    # the scores are halves: every partial sum is exact, so fsum's and sum's means are the same
    return bootstrap_mean_ci(scores, n_boot=n_boot, alpha=alpha, seed=seed)


def n_words(text: str) -> int:
    """Length used for length control: whitespace-separated words."""
    return len(text.split())


def length_controlled(
    outcomes: Sequence[str],
    len_a: Sequence[int],
    len_b: Sequence[int],
    *,
    tolerance: float = 0.10,
) -> dict[str, float | int | None]:
    """Mean lengths of each side and the win rate over length-matched pairs (see module doc)."""
    if not (len(outcomes) == len(len_a) == len(len_b)):
        raise ValueError("outcomes, len_a and len_b must have the same length")
    matched = [
        o
        for o, la, lb in zip(outcomes, len_a, len_b, strict=True)
        if abs(la - lb) <= tolerance * max(la, lb)
    ]
    n = len(outcomes)
    return {
        "mean_length_a": sum(len_a) / n if n else None,
        "mean_length_b": sum(len_b) / n if n else None,
        "tolerance": tolerance,
        "n_matched": len(matched),
        "n_matched_valid": sum(o in _SCORE for o in matched),
        "win_rate_matched": win_rate(matched),
    }


def summarize(
    outcomes: Sequence[str],
    len_a: Sequence[int] | None = None,
    len_b: Sequence[int] | None = None,
    *,
    seed: int = 0,
    n_boot: int = 2000,
    tolerance: float = 0.10,
) -> dict:
    """Counts, win rate (ties = 1/2), bootstrap 95 % CI and (given lengths) length control."""
    out: dict = counts(outcomes)
    out["win_rate"] = win_rate(outcomes)
    out["win_rate_definition"] = "(wins + ties/2) / (wins + ties + losses); invalid excluded"
    ci = bootstrap_ci(outcomes, n_boot=n_boot, seed=seed)
    out["ci95"] = list(ci) if ci else None
    if len_a is not None and len_b is not None:
        out["length_control"] = length_controlled(outcomes, len_a, len_b, tolerance=tolerance)
    return out


def format_summary(s: dict, name_a: str = "a", name_b: str = "b") -> str:
    """A few human-readable lines for the terminal."""
    wr = s.get("win_rate")
    ci = s.get("ci95")
    lines = [
        f"{name_a} vs {name_b}: n={s['n']} wins={s['wins']} ties={s['ties']} "
        f"losses={s['losses']} invalid={s['invalid']}"
        + (
            f" (unparseable {s['unparseable']}, failed {s['failed']})"
            if "unparseable" in s and "failed" in s
            else ""
        ),
        "win rate of a (ties = 1/2): "
        + ("n/a" if wr is None else f"{wr:.3f}")
        + ("" if not ci else f"  95% CI [{ci[0]:.3f}, {ci[1]:.3f}]"),
    ]
    lc = s.get("length_control")
    if lc and lc["mean_length_a"] is not None:
        wm = lc["win_rate_matched"]
        lines.append(
            f"mean length (words) a={lc['mean_length_a']:.1f} b={lc['mean_length_b']:.1f}; "
            f"length-matched pairs (<= {lc['tolerance']:.0%}): {lc['n_matched']}, win rate "
            + ("n/a" if wm is None else f"{wm:.3f}")
        )
    return "\n".join(lines)
