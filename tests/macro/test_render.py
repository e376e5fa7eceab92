"""Tests for marlhf.macro.render: terminal text, HTML page, histogram, token pieces."""

from __future__ import annotations

import base64
import doctest
import html
import re

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import marlhf.macro.render as render
from marlhf.macro.render import (
    plot_length_histogram,
    render_html,
    render_terminal,
    token_pieces,
)


def _word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", "a", "<b>", "&", "cat", "."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")


def test_doctests():
    assert doctest.testmod(render).failed == 0


def test_token_pieces_concatenate_to_decoded_text():
    tok = _word_tokenizer()
    ids = [2, 5, 3, 4, 6, 1]
    pieces = token_pieces(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    # WordLevel without a decoder joins tokens with spaces: hand-worked pieces, EOS kept
    assert pieces == ["a", " cat", " <b>", " &", " .", " [EOS]"]


def test_terminal_plain_and_color():
    pieces = ["The", " cat", " sat", " on", " it", "."]
    ends = [False, True, True, False, False, True]
    assert render_terminal(pieces, ends, color=False) == "The cat| sat| on it.|"
    colored = render_terminal(pieces, ends, color=True)
    assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == "The cat sat on it."
    assert colored.count("\x1b[0m") == 3  # one coloured span per macro action
    # a tail without macro_end (should not happen, but must not vanish)
    assert render_terminal(["a", "b"], [True, False], color=False) == "a|b|"


def test_html_has_every_token_in_order_and_one_span_per_macro(tmp_path):
    items = [
        {"prompt": "Q1 <x>", "pieces": ["a", " <b>", " &", " cat", "."],
         "macro_end": [False, True, False, False, True], "reward": 1.25},
        {"prompt": "Q2", "pieces": ["x", "y", "\n", "z"], "macro_end": [True, True, True, True]},
    ]  # fmt: skip
    path = render_html(items, tmp_path / "sub" / "page.html")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    spans = re.findall(
        r'<span class="ma"[^>]*title="macro (\d+), (\d+) tokens">(.*?)</span>', page, re.S
    )
    assert [(int(m), int(n)) for m, n, _ in spans] == [
        (0, 2),
        (1, 3),
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 1),
    ]
    texts = [t for _, _, t in spans]
    assert texts == ["a &lt;b&gt;", " &amp; cat.", "x", "y", "\n", "z"]
    assert "reward 1.2500" in page and "Q1 &lt;x&gt;" in page
    assert page.count('class="item"') == 2


def test_histogram_png(tmp_path):
    path = plot_length_histogram([1, 2, 2, 3, 5, 5, 5], tmp_path / "h.png", title="lengths")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_control_characters_are_shown_as_escapes_in_the_terminal_and_the_page(tmp_path):
    """ESC [2J would clear a terminal; U+202E would show "gnp.exe" as "exe.png"; C1 CSI (0x9b) is
    a terminal's escape too. Each shows as its escape; tab and newline stay."""
    pieces = ["ok\x1b[2J", " gnp\u202e", ".exe", "\t\u2066x\u2069\n", "\x9b1m\x07"]
    ends = [True, False, True, False, True]
    want = ["ok\\x1b[2J", " gnp\\u202e.exe", "\t\\u2066x\\u2069\n\\x9b1m\\x07"]
    assert render_terminal(pieces, ends, color=False) == "|".join(want) + "|"
    colored = render_terminal(pieces, ends, color=True)
    assert re.sub(r"\x1b\[(30;4[36]|0)m", "", colored) == "".join(want)
    path = render_html([{"prompt": "p\u202eq\x1b", "pieces": pieces, "macro_end": ends}],
                       tmp_path / "p.html", title="t\x1b", subtitle="s\u2067")  # fmt: skip
    page = path.read_text(encoding="utf-8")
    spans = re.findall(r'<span class="ma"[^>]*>(.*?)</span>', page, re.S)
    assert [html.unescape(s) for s in spans] == want
    assert "p\\u202eq\\x1b" in page and "t\\x1b" in page and "s\\u2067" in page
    bad = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x202E, 0x2066, 0x2067, 0x2069)]
    assert not any(c in page for c in bad if c not in "\t\n")


def test_page_embeds_its_figure_and_counts_macro_actions(tmp_path):
    png = plot_length_histogram([1, 2, 2], tmp_path / "h.png")
    items = [{"prompt": "q", "pieces": ["a", "b", "c"], "macro_end": [True, False, True]}]
    page = render_html(items, tmp_path / "p.html", figure=png).read_text(encoding="utf-8")
    data = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert data and base64.b64decode(data[1]) == png.read_bytes()
    assert "1 responses, 2 macro actions, mean length 1.50 tokens" in page
    assert "data:image" not in render_html(items, tmp_path / "q.html").read_text(encoding="utf-8")
