"""Sentence boundaries of a text (a rule-based splitter that knows common abbreviations), for the
backends that parse one sentence at a time.
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e u.s u.k inc ltd co corp no fig eq al approx dept "
    "est gen gov lt col sgt capt mt jan feb mar apr jun jul aug sep sept oct nov dec".split()
)


# A sentence may end after . ! ? (or …), then closing quotes/brackets, then whitespace.
_SENT_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of `text`, stripped of surrounding whitespace, none empty.

    Every newline ends a sentence (responses use them for lists and paragraphs). Inside a line, a
    sentence ends at ``. ! ?`` (plus closing quotes/brackets) followed by whitespace and an upper-case
    letter, digit, quote or bracket, unless the word before the period is a known abbreviation or a
    single-letter initial.

    >>> t = 'Dr. Smith said "Hi." Then he left!\\n\\n- item one'
    >>> [t[s:e] for s, e in split_sentences(t)]
    ['Dr. Smith said "Hi."', 'Then he left!', '- item one']
    """
    spans: list[tuple[int, int]] = []

    def add(s: int, e: int) -> None:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            spans.append((s, e))

    line_start = 0
    for line in text.splitlines(keepends=True):
        line_end = line_start + len(line)
        start = line_start
        for m in _SENT_END.finditer(text, line_start, line_end):
            nxt = m.end()
            while nxt < line_end and text[nxt].isspace():
                nxt += 1
            if nxt >= line_end:
                continue
            follower = text[nxt]
            if not (follower.isupper() or follower.isdigit() or follower in "\"'“‘([-"):
                continue
            if text[m.start()] == ".":
                word = text[start : m.start()].split()[-1:] or [""]
                w = word[0].lstrip("\"'“‘(").lower()
                if w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()):
                    continue
            add(start, m.end())
            start = m.end()
        add(start, line_end)
        line_start = line_end
    return spans
