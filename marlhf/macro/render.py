"""Show macro actions: coloured terminal text, a self-contained HTML page, a length histogram.

Token pieces come from `token_pieces`, which uses the same character-offset computation as the parsing
rule (`marlhf.macro.parsing.spans.token_char_spans`), so what is shown is exactly what was segmented.
Control characters of a response are shown as escapes in both (`visible`): a terminal would obey
``ESC[2J`` (clear the screen), and a bidirectional override (U+202E) turns ``gnp.exe`` into what
reads as ``exe.png`` in a terminal and on the page.

>>> print(render_terminal(["The", " cat", " sat", "."], [False, True, False, True], color=False))
The cat| sat.|
"""

from __future__ import annotations

import base64
import html
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marlhf.macro.parsing.spans import token_char_spans

__all__ = [
    "macro_groups",
    "plot_length_histogram",
    "render_html",
    "render_terminal",
    "render_terminal_turns",
    "token_pieces",
    "visible",
]

# Two background colours for the terminal (ANSI) and the HTML page, alternating per macro action.
_ANSI = ("\x1b[30;46m", "\x1b[30;43m")
_ANSI_RESET = "\x1b[0m"
_HTML_BG = ("#cdeffd", "#fde9b5")

# control characters shown as escapes: C0 but tab and newline, DEL and C1 (terminal control
# sequences), and the bidirectional-text controls (marks, embeddings, overrides, isolates)
_CONTROLS = [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: f"\\x{c:02x}" for c in _CONTROLS} | {c: f"\\u{c:04x}" for c in _BIDI}


def visible(text: str) -> str:
    r"""``text`` with its terminal and bidirectional-text controls written as escapes (``\x1b``,
    ``\u202e``); tab and newline kept.

    >>> print(visible("a\x1b[2Jb gnp\u202e.exe\n"))
    a\x1b[2Jb gnp\u202e.exe
    <BLANKLINE>
    """
    return text.translate(_ESCAPES)


def token_pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text each token adds to the decoded response (special tokens included; a token completing
    a multi-byte character carries it, the partial ones are empty). ``"".join`` gives the decoded text.
    """
    text, spans = token_char_spans(tokenizer, ids, skip_special_tokens=False)
    return [text[s:e] for s, e in spans]


def macro_groups(macro_end: Sequence[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` token ranges of the macro actions; a tail without an end is its own group.

    >>> macro_groups([False, True, True, False])
    [(0, 2), (2, 3), (3, 4)]
    """
    groups = []
    start = 0
    for k, end in enumerate(macro_end):
        if end:
            groups.append((start, k + 1))
            start = k + 1
    if start < len(macro_end):
        groups.append((start, len(macro_end)))
    return groups


def render_terminal(pieces: list[str], macro_end: list[bool], color: bool | None = None) -> str:
    """One response with its macro actions marked.

    Args:
        pieces: (A,) text of each token (`token_pieces`).
        macro_end: (A,) true on the last token of each macro action.
        color: ANSI background colours alternating per macro action; None = only when stdout is a
            terminal and ``NO_COLOR`` is unset. Without colour a ``|`` follows each macro action.
    """
    if len(pieces) != len(macro_end):
        raise ValueError(f"{len(pieces)} token pieces but {len(macro_end)} macro_end flags")
    if color is None:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    out = []
    for m, (s, e) in enumerate(macro_groups(macro_end)):
        text = visible("".join(pieces[s:e]))
        out.append(f"{_ANSI[m % 2]}{text}{_ANSI_RESET}" if color else text + "|")
    return "".join(out)


def _reward_text(reward: Any) -> str:
    return "no reward" if reward is None else f"reward {float(reward):.4f}"


def render_terminal_turns(turns: list[dict], color: bool | None = None) -> str:
    """A multi-turn conversation, one turn a line: each policy turn (``{"role": "policy",
    "pieces", "macro_end", "reward"}``) as ``policy k, reward r:`` and its macro actions
    (:func:`render_terminal`: a macro action never spans an observation, each turn is cut on its
    own), each observation (``{"role": "observation", "text", "message_role"}``) indented as
    ``observation (role):`` and its text; control characters shown as escapes (:func:`visible`).

    >>> print(render_terminal_turns([
    ...     {"role": "policy", "pieces": [" call", " my", " boss"], "macro_end": [False, False, True],
    ...      "reward": 0.0},
    ...     {"role": "observation", "text": "my boss: call my cousin.", "message_role": "user"},
    ...     {"role": "policy", "pieces": [" my", " cousin"], "macro_end": [True, True], "reward": 1.0},
    ... ], color=False))
    policy 1, reward 0.0000:  call my boss|
        observation (user): my boss: call my cousin.
    policy 2, reward 1.0000:  my| cousin|
    """
    lines, k = [], 0
    for turn in turns:
        if turn["role"] == "policy":
            k += 1
            text = render_terminal(list(turn["pieces"]), list(turn["macro_end"]), color=color)
            lines.append(f"policy {k}, {_reward_text(turn.get('reward'))}: {text}")
        else:
            role = visible(str(turn.get("message_role") or "observation"))
            lines.append(f"    observation ({role}): {visible(str(turn['text']))}")
    return "\n".join(lines)


def _html_spans(pieces: list[str], ends: list[bool], lengths: list[int]) -> str:
    """The macro actions of one response (or policy turn) as spans; their lengths appended to
    ``lengths``."""
    spans = []
    for m, (s, e) in enumerate(macro_groups(ends)):
        lengths.append(e - s)
        text = html.escape(visible("".join(pieces[s:e])))
        spans.append(
            f'<span class="ma" style="background:{_HTML_BG[m % 2]}" '
            f'title="macro {m}, {e - s} tokens">{text}</span>'
        )
    return "".join(spans)


def _html_turns(turns: list[dict], n: int, lengths: list[int]) -> str:
    """The turns of item ``n``: each policy turn a block with its reward and macro actions, each
    observation a block of context."""
    blocks, k = [], 0
    for turn in turns:
        if turn["role"] == "policy":
            k += 1
            pieces, ends = list(turn["pieces"]), list(turn["macro_end"])
            if len(pieces) != len(ends):
                raise ValueError(
                    f"item {n}, policy turn {k}: {len(pieces)} pieces but {len(ends)} macro_end "
                    "flags"
                )
            head = f"policy {k} &middot; {_reward_text(turn.get('reward'))}"
            blocks.append(
                f'<div class="turn policy"><div class="who">{head}</div>'
                f'<div class="response">{_html_spans(pieces, ends, lengths)}</div></div>'
            )
        else:
            role = html.escape(visible(str(turn.get("message_role") or "observation")))
            text = html.escape(visible(str(turn["text"])))
            blocks.append(
                f'<div class="turn observation"><div class="who">observation ({role})</div>'
                f'<div class="obs">{text}</div></div>'
            )
    return "".join(blocks)


def render_html(
    items: list[dict],
    path: str | os.PathLike,
    title: str = "Macro actions",
    subtitle: str = "",
    figure: str | os.PathLike | None = None,
) -> Path:
    """Write a self-contained HTML page showing responses split into macro actions.

    Args:
        items: one dict per response with ``prompt`` (str), ``pieces`` (list[str], one per token),
            ``macro_end`` (list[bool], same length) and optionally ``reward`` (float); a
            multi-turn conversation has ``turns`` instead of ``pieces`` and ``macro_end`` (the
            dicts of :func:`render_terminal_turns`), shown turn by turn: each policy turn with its
            reward and macro actions, each observation as context between them.
        path: the .html file to write (parent folders are created).
        subtitle: a line under the title (e.g. where the rule came from).
        figure: a PNG shown at the end of the page, embedded in it (the histogram of macro-action
            lengths, `plot_length_histogram`).

    Each macro action is a ``<span class="ma">`` with alternating background and a tooltip
    ``macro i, n tokens``; token pieces are HTML-escaped, control characters shown as escapes
    (`visible`), whitespace kept (``white-space: pre-wrap``). A line under the title counts the
    responses and macro actions and gives their mean length.
    """
    blocks, lengths = [], []
    for n, item in enumerate(items):
        if item.get("turns") is not None:
            body = _html_turns(list(item["turns"]), n, lengths)
        else:
            pieces, ends = list(item["pieces"]), list(item["macro_end"])
            if len(pieces) != len(ends):
                raise ValueError(f"item {n}: {len(pieces)} pieces but {len(ends)} macro_end flags")
            body = f'<div class="response">{_html_spans(pieces, ends, lengths)}</div>'
        reward = item.get("reward")
        reward_html = (
            "" if reward is None else f'<div class="reward">reward {float(reward):.4f}</div>'
        )
        prompt = html.escape(visible(str(item.get("prompt", ""))))
        blocks.append(
            f'<div class="item"><div class="prompt">{prompt}</div>{body}{reward_html}</div>'
        )
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    summary = (
        f"{len(items)} responses, {len(lengths)} macro actions, mean length {mean:.2f} tokens"
        + ("; their histogram is at the end of the page" if figure is not None else "")
    )
    figure_html = ""
    if figure is not None:
        data = base64.b64encode(Path(figure).read_bytes()).decode("ascii")
        figure_html = (
            '\n<h2 id="lengths">Macro-action lengths</h2>\n'
            f'<img alt="histogram of macro-action lengths" src="data:image/png;base64,{data}">'
        )
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(visible(title))}</title><style>"
        "body{font-family:sans-serif;max-width:60em;margin:auto}"
        ".item{border-bottom:1px solid #ccc;padding:1em 0}"
        ".prompt{color:#555;white-space:pre-wrap;margin-bottom:.5em}"
        ".response{white-space:pre-wrap;font-family:monospace;line-height:1.6}"
        ".ma{border-radius:3px}.reward{color:#060;margin-top:.3em}"
        ".sub{color:#555}"
        ".turn{margin:.3em 0 .3em 0}.who{font-size:80%;color:#555}"
        ".policy{border-left:3px solid #4a90d9;padding-left:.5em}"
        ".observation{border-left:3px solid #aaa;padding-left:.5em;margin-left:2em}"
        ".obs{white-space:pre-wrap;color:#444;font-style:italic}"
        f"</style></head><body><h1>{html.escape(visible(title))}</h1>\n"
        + (f'<p class="sub">{html.escape(visible(subtitle))}</p>\n' if subtitle else "")
        + f'<p class="sub">{html.escape(summary)}</p>\n'
        + "\n".join(blocks)
        + figure_html
        + "\n</body></html>\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def plot_length_histogram(lengths: list[int], path: str | os.PathLike, title: str = "") -> Path:
    """Save a PNG histogram of macro-action lengths (tokens per macro action)."""
    # The Agg canvas directly: no pyplot state, no change to the user's global backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not lengths:
        raise ValueError("plot_length_histogram: no lengths given")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(6, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    top = max(lengths)
    ax.hist(lengths, bins=range(1, top + 2), align="left", rwidth=0.85, color="#4a90d9")
    ax.set_xlabel("tokens per macro action")
    ax.set_ylabel("count")
    mean = sum(lengths) / len(lengths)
    ax.set_title(title or f"macro-action lengths (n={len(lengths)}, mean {mean:.2f})")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return path
