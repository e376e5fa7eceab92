"""The short dataset names shared by every evaluation tool: inference, the LLM judge, evaluation-set
sampling (and so the results directories they write).

==============  ================================  ======  ===========================================
name            data spec                         alias   judge template
==============  ================================  ======  ===========================================
``summarize``   ``openai/summarize_from_feedback`` tldr    ``summarize``
``hh-rlhf``     ``Dahoas/full-hh-rlhf``            hh      ``hh-rlhf``
``webgpt``      ``openai/webgpt_comparisons``              ``webgpt`` (per criterion)
``apps``        ``codeparrot/apps``                        none: programs are scored by their tests
``synthetic``   ``synthetic-tldr``                         ``summarize`` (a synthetic TL;DR task)
==============  ================================  ======  ===========================================

A tool that takes ``--dataset`` accepts these names and aliases (and, where data are read, the data
spec itself or a local file); a tool that cannot use one says so instead of guessing.

>>> canonical("hh"), canonical("openai/summarize_from_feedback"), canonical("my.jsonl")
('hh-rlhf', 'summarize', None)
>>> names_help()
'summarize (alias tldr), hh-rlhf (alias hh), webgpt, apps, synthetic'
"""

from __future__ import annotations

from collections.abc import Iterable

# Canonical short name -> data spec (marlhf.data.adapters resolves the spec).
DATASETS: dict[str, str] = {
    "summarize": "openai/summarize_from_feedback",
    "hh-rlhf": "Dahoas/full-hh-rlhf",
    "webgpt": "openai/webgpt_comparisons",
    "apps": "codeparrot/apps",
    "synthetic": "synthetic-tldr",
}
ALIASES: dict[str, str] = {"tldr": "summarize", "hh": "hh-rlhf"}


def canonical(name: str) -> str | None:
    """The canonical short name of ``name`` (a short name, an alias or a data spec), else None."""
    if name in DATASETS:
        return name
    if name in ALIASES:
        return ALIASES[name]
    for short, spec in DATASETS.items():
        if name == spec:
            return short
    return None


def names_help(names: Iterable[str] | None = None) -> str:
    """``summarize (alias tldr), hh-rlhf (alias hh), ...`` for ``--help`` texts and errors."""
    parts = []
    for n in DATASETS if names is None else names:
        aliases = [a for a, c in ALIASES.items() if c == n]
        parts.append(f"{n} (alias {', '.join(aliases)})" if aliases else n)
    return ", ".join(parts)
