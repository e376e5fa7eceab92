"""Parsing-based termination (MA-RLHF Sec. 3.1): constituency spans of the response become macro actions.

Pipeline for one response (one row of the batch):

1. **Character offsets of the generated tokens** (`token_char_spans`). The sampled ids need not equal
   the tokenizer's re-encoding of the decoded text, so leaves are never re-tokenised (the original did,
   and crashed). Instead token k's span ends where the prefix decode ``decode(ids[:k+1])`` stops
   agreeing with the full decoded text. A token that decodes to a partial UTF-8 character (the
   prefix ends in U+FFFD) or to nothing gets an empty span; the token that completes the character gets
   it. Ends are kept non-decreasing and the last token reaches the end of the text. The prefixes are
   not all decoded: each token's piece comes from decoding it with a few tokens of left context, as
   streaming detokenizers do (O(A)), checked against the full text, with exact prefix decodes where a
   piece cannot be trusted.
2. **Parse** the decoded text with a `ConstituencyBackend` into trees of `Node` whose ``start``/``end``
   are character offsets into the text: ``benepar`` (Berkeley constituency parser), ``spacy``
   (dependency subtrees as phrases) or ``python`` (statements and expressions of Python source).
3. **Macro-action DFS** (`macro_starts`, the paper's rule): a node with >= 2 leaves covering fewer than
   ``--parsing_cutoff`` policy tokens is one macro action; a larger node is split into its children; a
   single-leaf node joins the previous macro action (the next one if it comes first). Macro actions
   partition the text at their start characters, so characters no tree covers (whitespace between
   sentences, newlines, trailing text of a truncated response) join the preceding macro action (the
   first one if they come before it).
4. **Back to tokens**: a token belongs to the macro action holding its last non-space character;
   ``macro_end[k]`` is true where the next token belongs to another macro action, and on the last token.

Any exception for a row makes that row fall back to ``fixed`` with ``--ngram`` (``fallback[b] = True``,
one warning per distinct error type).

Example, with a hand-written bracketed tree and a word-level "tokenizer" whose tokens are the words:

>>> text = "The cat sat on the mat."
>>> tree = bracketed(text, "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) "
...                        "(NP (DT the) (NN mat)))) (. .))")
>>> [text[n.start:n.end] for n in tree.children]
['The cat', 'sat on the mat', '.']
>>> spans = [(0, 3), (3, 7), (7, 11), (11, 14), (14, 18), (18, 22), (22, 23)]
>>> starts = macro_starts([tree], _TokenCounter(spans, len(text)), cutoff=4)
>>> [text[s:e] for s, e in zip(starts, starts[1:] + [len(text)])]
['The cat sat ', 'on the mat.']
"""

from __future__ import annotations

import ast
import bisect
import concurrent.futures
import functools
import io
import logging
import multiprocessing
import re
import tokenize
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from marlhf.macro.config import MacroConfig
from marlhf.macro.termination import (
    FixedRule,
    TerminationInputs,
    TerminationOutput,
    register_rule,
)

__all__ = [
    "BeneparBackend",
    "ConstituencyBackend",
    "Node",
    "ParsingRule",
    "PythonBackend",
    "SpacyBackend",
    "bracketed",
    "build_backend",
    "dependency_trees",
    "macro_starts",
    "segment_row",
    "split_sentences",
    "token_char_spans",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# trees


@dataclass
class Node:
    """A constituent: characters ``[start, end)`` of the response text; a leaf has no children."""

    start: int
    end: int
    children: list[Node] = field(default_factory=list)
    label: str = ""

    def n_leaves(self) -> int:
        return 1 if not self.children else sum(c.n_leaves() for c in self.children)

    def shifted(self, offset: int) -> Node:
        """A copy with every span moved by `offset` characters."""
        return Node(
            self.start + offset,
            self.end + offset,
            [c.shifted(offset) for c in self.children],
            self.label,
        )


class ConstituencyBackend(Protocol):
    """Parses a response into one tree per sentence (spans are character offsets into `text`)."""

    def parse(self, text: str) -> list[Node]: ...


# --------------------------------------------------------------------------------------------------
# 1. character offsets of generated tokens


def _decode_many(tokenizer: Any, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # one Rust call; no clean-up of spaces (it is not prefix-stable)
        return backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)
    return [
        tokenizer.decode(
            s, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
        for s in seqs
    ]


def _exact_end(prefix: str, text: str, prev: int) -> int:
    """e_k of the reference rule: where ``prefix = decode(ids[:k+1])`` stops agreeing with `text`."""
    if not prefix.startswith(text[:prev]):
        return prev  # the prefix rewrote earlier text; this token adds nothing
    end = prev
    limit = min(len(prefix), len(text))
    while end < limit and prefix[end] == text[end]:
        end += 1
    return end


def _prefix_spans(
    tokenizer: Any, ids: list[int], text: str, skip_special_tokens: bool
) -> list[tuple[int, int]]:
    """The reference rule, decoding every prefix (A decodes of up to A tokens: O(A^2))."""
    decoded = _decode_many(tokenizer, [ids[: k + 1] for k in range(len(ids))], skip_special_tokens)
    spans: list[tuple[int, int]] = []
    prev = 0
    for k, prefix in enumerate(decoded):
        end = len(text) if k == len(ids) - 1 else _exact_end(prefix, text, prev)
        spans.append((prev, end))
        prev = end
    return spans


# Tokens of left context in each incremental decode. One is enough for the decoders we know
# (byte-level, SentencePiece's leading-space strip, WordPiece's "##"); a few more cost little.
_SPAN_WINDOW = 4


def _incremental_spans(
    tokenizer: Any, ids: list[int], text: str, skip_special_tokens: bool
) -> list[tuple[int, int]] | None:
    """The reference rule in O(A * window) decoded tokens, or None when a check fails.

    A token k is *clean* when ``after = decode(ids[p:k+1])`` extends ``before = decode(ids[p:k])``
    (p a few tokens back) by a piece ``after[len(before):]`` holding no U+FFFD (no partial character):
    the piece is what the token adds to the text, as in streaming detokenizers. While the prefix
    decode so far is a prefix of `text` ("in sync" at length L), a clean token whose piece continues
    `text` at L moves L on, and the reference end is ``max(prev, L)``. Any other token (partial UTF-8
    character, a decoder rewriting earlier text) gets its prefix decoded exactly. Checks: a few prefix
    decodes compared with the claimed ``text[:L]``, and L reaching ``len(text)`` at the last token.
    """
    n = len(ids)
    lo = [max(0, k - _SPAN_WINDOW) for k in range(n)]
    seqs = [ids[:1]]
    for k in range(1, n):
        seqs.append(ids[lo[k] : k])
        seqs.append(ids[lo[k] : k + 1])
    checkpoints = sorted({n // 4, n // 2, (3 * n) // 4} - {0, n - 1})
    seqs.extend(ids[: k + 1] for k in checkpoints)
    decoded = _decode_many(tokenizer, seqs, skip_special_tokens)
    exact_at = dict(zip(checkpoints, decoded[2 * n - 1 :], strict=True))
    exact_at[0] = decoded[0]
    # tokens that are not clean whatever the sync: their exact prefixes in one more batched call
    unclean = [
        k
        for k in range(1, n)
        if k not in exact_at
        and (
            not decoded[2 * k].startswith(decoded[2 * k - 1])
            or "\ufffd" in decoded[2 * k][len(decoded[2 * k - 1]) :]
        )
    ]
    if unclean:
        prefixes = _decode_many(tokenizer, [ids[: k + 1] for k in unclean], skip_special_tokens)
        exact_at.update(zip(unclean, prefixes, strict=True))

    def exact(k: int) -> str:
        if k not in exact_at:
            exact_at[k] = _decode_many(tokenizer, [ids[: k + 1]], skip_special_tokens)[0]
        return exact_at[k]

    spans: list[tuple[int, int]] = []
    prev = 0
    synced: int | None = 0  # L: decode(ids[:k]) == text[:L], or None when not known to be so
    for k in range(n):
        piece = None
        if k > 0 and synced is not None:
            before, after = decoded[2 * k - 1], decoded[2 * k]
            if after.startswith(before):
                piece = after[len(before) :]
                if "\ufffd" in piece or not text.startswith(piece, synced):
                    piece = None
        if piece is not None:
            assert synced is not None
            synced += len(piece)
            if k in exact_at and exact_at[k] != text[:synced]:
                return None  # the decoder is not incremental after all
            end = max(prev, synced)
        else:
            prefix = exact(k)
            end = _exact_end(prefix, text, prev)
            synced = len(prefix) if text.startswith(prefix) else None
        if k == n - 1:
            if synced is not None and synced != len(text):
                return None  # the pieces do not add up to the full decode
            end = len(text)
        spans.append((prev, end))
        prev = end
    return spans


def token_char_spans(
    tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool = True
) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text of `ids` and each token's character span ``[s_k, e_k)`` in it.

    e_k is the length of the common prefix of ``decode(ids[:k+1])`` and ``decode(ids)``, made
    non-decreasing; the last token ends at ``len(text)``. Spans tile the text: ``s_0 = 0``,
    ``s_{k+1} = e_k``. Tokens that decode to nothing (special tokens when skipped) or to an incomplete
    character get an empty span. Cost: about 2A decodes of a few tokens (`_incremental_spans`, one
    batched call for fast tokenizers) plus one exact prefix decode per token that completes a
    multi-byte character or makes the decoder rewrite earlier text; if the incremental pieces fail
    their checks, every prefix is decoded (A decodes of up to A tokens), with the same result.
    """
    ids = [int(i) for i in ids]
    if not ids:
        return "", []
    text = _decode_many(tokenizer, [ids], skip_special_tokens)[0]
    spans = _incremental_spans(tokenizer, ids, text, skip_special_tokens)
    if spans is None:
        spans = _prefix_spans(tokenizer, ids, text, skip_special_tokens)
    return text, spans


class _TokenCounter:
    """Counts policy tokens overlapping a character range, and maps characters to macro owners.

    Args:
        spans: per-token ``(s, e)`` character spans tiling ``[0, n_chars)`` (some may be empty).
    """

    def __init__(self, spans: Sequence[tuple[int, int]], n_chars: int) -> None:
        self.spans = list(spans)
        # rank[c] = index among non-empty tokens of the token covering character c
        self.rank = [0] * n_chars
        r = -1
        for s, e in self.spans:
            if e > s:
                r += 1
                for c in range(s, min(e, n_chars)):
                    self.rank[c] = r

    def count(self, start: int, end: int) -> int:
        """Number of tokens overlapping characters ``[start, end)``."""
        if end <= start:
            return 0
        return self.rank[end - 1] - self.rank[start] + 1


# --------------------------------------------------------------------------------------------------
# 2a. sentence splitting

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


# --------------------------------------------------------------------------------------------------
# 2b. bracketed (PTB) trees aligned to text

# How a parser may write a character sequence of the original text.
_PTB_LEAF = {
    "-LRB-": ["("],
    "-RRB-": [")"],
    "-LSB-": ["["],
    "-RSB-": ["]"],
    "-LCB-": ["{"],
    "-RCB-": ["}"],
    "``": ['"', "“", "``", "„", "'", "‘"],
    "''": ['"', "”", "''", "'", "’"],
    "`": ["'", "‘", "`"],
    "'": ["'", "’"],
    "...": ["...", "…"],
    "--": ["--", "–", "—"],
}
_PTB_INNER = [
    ("-LRB-", "("),
    ("-RRB-", ")"),
    ("-LSB-", "["),
    ("-RSB-", "]"),
    ("-LCB-", "{"),
    ("-RCB-", "}"),
    ("\\/", "/"),
    ("\\*", "*"),
]
_BRACKET_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def _leaf_candidates(word: str) -> list[str]:
    out = list(_PTB_LEAF.get(word, []))
    unescaped = word
    for esc, ch in _PTB_INNER:
        unescaped = unescaped.replace(esc, ch)
    for w in (unescaped, word, unescaped.replace("'", "’")):  # "'s" / "n't" may be curly
        if w not in out:
            out.append(w)
    return out


def _match_spaced(text: str, pos: int, word: str) -> int:
    """End of `word` matched at `pos` allowing whitespace in `text` between its characters, or -1."""
    i = pos
    for j, ch in enumerate(word):
        if j > 0:
            while i < len(text) and text[i].isspace() and text[i] != ch:
                i += 1
        if i >= len(text) or text[i] != ch:
            return -1
        i += 1
    return i


def _align_leaf(text: str, pos: int, word: str) -> tuple[int, int]:
    """Span of parser leaf `word` in `text` at or after `pos` (skipping whitespace)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    cands = _leaf_candidates(word)
    for c in cands:
        if text.startswith(c, pos):
            return pos, pos + len(c)
    # The decoded text may space a token out ("don ' t" from a WordPiece decoder for "don't").
    for c in cands:
        end = _match_spaced(text, pos, c)
        if end > 0:
            return pos, end
    # The parser dropped or rewrote a few characters: accept a match a little further on.
    best: tuple[int, int] | None = None
    for c in cands:
        i = text.find(c, pos, pos + len(c) + 8)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(c))
    if best is None:
        raise ValueError(
            f"cannot align parser leaf {word!r} at character {pos}: text there is "
            f"{text[pos : pos + 20]!r}"
        )
    return best


def bracketed(text: str, tree_string: str) -> Node:
    """Build a `Node` tree from a PTB bracketed string, aligning its leaves to `text`.

    Leaves are matched left to right against `text` (whitespace skipped), undoing PTB escapes
    (``-LRB-`` ``-RRB-`` ``-LSB-`` ... ``\\/``; ``\\`\\``` and ``''`` match straight or curly quotes).
    Preterminals ``(TAG word)`` become leaves labelled TAG; unary chains are kept; empty constituents
    are dropped. The root spans from its first to its last leaf.

    Raises:
        ValueError: unbalanced brackets, no leaves, or a leaf that cannot be aligned.

    >>> t = "He said (quietly) \\"no\\"."
    >>> tree = bracketed(t, "(S (NP (PRP He)) (VP (VBD said) (-LRB- -LRB-) (ADVP (RB quietly)) "
    ...                     "(-RRB- -RRB-) (`` ``) (NP (DT no)) ('' '')) (. .))")
    >>> [t[leaf.start:leaf.end] for leaf in _leaves(tree)]
    ['He', 'said', '(', 'quietly', ')', '"', 'no', '"', '.']
    """
    toks = _BRACKET_TOKEN.findall(tree_string)
    pos = 0
    i = 0

    def parse_node() -> Node | None:
        nonlocal pos, i
        if toks[i] != "(":
            raise ValueError(f"bracketed tree: expected '(' at token {i} of {tree_string!r}")
        i += 1
        label = ""
        if i < len(toks) and toks[i] not in "()":
            label = toks[i]
            i += 1
        children: list[Node] = []
        words: list[str] = []
        while i < len(toks) and toks[i] != ")":
            if toks[i] == "(":
                child = parse_node()
                if child is not None:
                    children.append(child)
            else:
                words.append(toks[i])
                i += 1
        if i >= len(toks):
            raise ValueError(f"bracketed tree: unbalanced brackets in {tree_string!r}")
        i += 1  # ")"
        if words and not children:  # preterminal (TAG word ...)
            s, e = _align_leaf(text, pos, words[0])
            for w in words[1:]:
                _, e = _align_leaf(text, e, w)
            pos = e
            return Node(s, e, [], label)
        if not children:
            return None
        if len(children) == 1 and not label:
            return children[0]
        return Node(children[0].start, children[-1].end, children, label)

    roots: list[Node] = []
    while i < len(toks):
        node = parse_node()
        if node is not None:
            roots.append(node)
    if not roots:
        raise ValueError(f"bracketed tree has no leaves: {tree_string!r}")
    if len(roots) == 1:
        return roots[0]
    return Node(roots[0].start, roots[-1].end, roots, "")


def _leaves(node: Node) -> list[Node]:
    if not node.children:
        return [node]
    return [leaf for c in node.children for leaf in _leaves(c)]


# --------------------------------------------------------------------------------------------------
# 2c. backends


def _load_spacy(spacy_model: str) -> Any:
    import spacy

    if spacy_model.startswith("blank:"):
        return spacy.blank(spacy_model.split(":", 1)[1])
    try:
        return spacy.load(spacy_model)
    except OSError as err:
        raise RuntimeError(
            f"--spacy_model {spacy_model!r} is not installed. Install it on a networked machine "
            f"with `python -m spacy download {spacy_model}` (or give a path to a saved pipeline)."
        ) from err


def _pipe(nlp: Any, texts: list[str]) -> list[Any]:
    """``nlp`` over the sentences of a response: one batched ``nlp.pipe`` call when it has one (a
    neural pipeline on ~45 short sentences is several times faster batched than called per sentence),
    else one call per text."""
    pipe = getattr(nlp, "pipe", None)
    return list(pipe(texts)) if pipe is not None else [nlp(t) for t in texts]


class BeneparBackend:
    """Berkeley Neural Parser (benepar) on a spaCy pipeline; one tree per sentence.

    The response is first cut by `split_sentences`; each piece is run through spaCy + benepar (which may
    split it further; every spaCy sentence gets its own tree). ``sent._.parse_string`` is aligned back to
    the original characters with `bracketed`, so PTB escapes and parser-side rewrites never shift spans.

    Needs ``pip install benepar`` plus two downloads that cannot be made offline:
    ``python -c "import benepar; benepar.download('benepar_en3')"`` and
    ``python -m spacy download en_core_web_sm`` (``--spacy_model blank:en`` uses spaCy's rule-based
    sentencizer instead of a trained pipeline).
    """

    def __init__(self, spacy_model: str = "en_core_web_sm", benepar_model: str = "benepar_en3"):
        try:
            import benepar  # noqa: F401  (registers the "benepar" spaCy factory)
        except ImportError as err:
            raise RuntimeError(
                "--parser_backend benepar needs the benepar package: `pip install benepar`, then "
                f"`python -c \"import benepar; benepar.download('{benepar_model}')\"` and "
                f"`python -m spacy download {spacy_model}` on a machine with network access "
                "(or use --parser_backend spacy / python)."
            ) from err
        nlp = _load_spacy(spacy_model)
        if not any(p in nlp.pipe_names for p in ("parser", "senter", "sentencizer")):
            nlp.add_pipe("sentencizer")
        if "benepar" not in nlp.pipe_names:
            try:
                nlp.add_pipe("benepar", config={"model": benepar_model})
            except Exception as err:  # benepar raises LookupError/OSError/ValueError by version
                raise RuntimeError(
                    f"benepar model {benepar_model!r} could not be loaded ({err}). Download it with "
                    f"`python -c \"import benepar; benepar.download('{benepar_model}')\"`."
                ) from err
        self.nlp = nlp

    def parse(self, text: str) -> list[Node]:
        trees = []
        spans = split_sentences(text)
        for (s, _), doc in zip(spans, _pipe(self.nlp, [text[s:e] for s, e in spans]), strict=True):
            for sent in doc.sents:
                if not sent.text.strip():
                    continue
                sub = doc.text[sent.start_char : sent.end_char]
                trees.append(bracketed(sub, sent._.parse_string).shifted(s + sent.start_char))
        return trees


def dependency_trees(doc: Any) -> list[Node]:
    """Phrase trees from a spaCy dependency parse, one per sentence of `doc` (a ``spacy.tokens.Doc``).

    Each token with dependents becomes a node spanning its subtree; its children are its dependents'
    subtrees plus the token itself as a leaf, in text order. Whitespace tokens are skipped.
    """

    def build(tok: Any) -> Node:
        leaf = Node(tok.idx, tok.idx + len(tok.text), [], tok.dep_ or tok.pos_)
        deps = [build(c) for c in tok.children if not c.is_space]
        if not deps:
            return leaf
        children = sorted(deps + [leaf], key=lambda n: (n.start, n.end))
        return Node(
            min(n.start for n in children), max(n.end for n in children), children, tok.dep_
        )

    return [build(sent.root) for sent in doc.sents if not sent.root.is_space]


class SpacyBackend:
    """spaCy dependency subtrees as phrase spans (`dependency_trees`); needs a pipeline with a parser.

    Args:
        spacy_model: pipeline name or path (``python -m spacy download en_core_web_sm``).
        nlp: an already built callable ``text -> Doc`` (overrides `spacy_model`).
    """

    def __init__(
        self, spacy_model: str = "en_core_web_sm", nlp: Callable[[str], Any] | None = None
    ):
        if nlp is None:
            nlp = _load_spacy(spacy_model)
            if "parser" not in nlp.pipe_names:
                raise RuntimeError(
                    f"--parser_backend spacy needs a pipeline with a dependency parser; "
                    f"{spacy_model!r} has {nlp.pipe_names}. Try `python -m spacy download "
                    "en_core_web_sm`."
                )
        self.nlp = nlp

    def parse(self, text: str) -> list[Node]:
        trees = []
        spans = split_sentences(text)
        for (s, _), doc in zip(spans, _pipe(self.nlp, [text[s:e] for s, e in spans]), strict=True):
            trees.extend(t.shifted(s) for t in dependency_trees(doc))
        return trees


_SKIP_TOKENS = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())
    return starts


def _python_leaves(text: str) -> list[tuple[int, int]]:
    """Character spans of Python tokens, as far as `tokenize` gets (regex words/punctuation after)."""
    lines = _line_starts(text)
    leaves: list[tuple[int, int]] = []
    done = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if (
                tok.type in _SKIP_TOKENS
                or tok.type == tokenize.ERRORTOKEN
                and not tok.string.strip()
            ):
                continue
            s = lines[tok.start[0] - 1] + tok.start[1]
            e = lines[tok.end[0] - 1] + tok.end[1]
            if e > s:
                leaves.append((s, e))
                done = e
    except (tokenize.TokenError, SyntaxError, IndexError):
        pass
    for m in re.finditer(r"\w+|[^\w\s]", text[done:]):
        leaves.append((done + m.start(), done + m.end()))
    return leaves


def _tree_from_spans(
    spans: list[tuple[int, int, str]], leaves: list[tuple[int, int]], text_end: int
) -> list[Node]:
    """Nest labelled spans into a forest whose leaves are `leaves`.

    Spans not aligned with leaf boundaries (inside one token, e.g. f-string parts) or crossing an
    earlier span are dropped, as are spans holding no leaf.
    """
    starts = {s for s, _ in leaves}
    ends = {e for _, e in leaves}
    items = sorted(
        {(s, e, lab) for s, e, lab in spans if s in starts and e in ends and e > s},
        key=lambda x: (x[0], -x[1]),
    )
    root = Node(0, text_end, [], "")
    stack = [root]
    li = 0
    for s, e, lab in items + [(text_end + 1, text_end + 1, "")]:
        # place leaves that start before this span
        while li < len(leaves) and leaves[li][0] < s:
            ls, le = leaves[li]
            while stack[-1] is not root and ls >= stack[-1].end:
                stack.pop()
            stack[-1].children.append(Node(ls, le, [], "tok"))
            li += 1
        while stack[-1] is not root and s >= stack[-1].end:
            stack.pop()
        if e > stack[-1].end and stack[-1] is not root:
            continue  # crosses its parent
        if s > text_end:
            break
        node = Node(s, e, [], lab)
        stack[-1].children.append(node)
        stack.append(node)

    def prune(n: Node) -> Node | None:
        if n.label == "tok":
            return n
        kids = [k for k in (prune(c) for c in n.children) if k is not None]
        if not kids:
            return None
        if len(kids) == 1:
            return kids[0]
        return Node(n.start, n.end, kids, n.label)

    out = []
    for c in root.children:
        p = prune(c)
        if p is not None:
            out.append(p)
    return out


_CLAUSE = re.compile(r"\b(else|finally)\s*:")


def _ast_spans(tree: ast.AST, text: str) -> list[tuple[int, int, str]]:
    """Labelled spans of statements, clause headers, blocks and expressions of a parsed module."""
    starts = _line_starts(text)
    line_texts = text.split("\n")

    def pos(lineno: int, col: int) -> int:  # ast columns are UTF-8 byte offsets
        line = line_texts[lineno - 1]
        if line.isascii():
            return starts[lineno - 1] + col
        return starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))

    spans: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or getattr(node, "end_lineno", None) is None:
            continue
        s = pos(node.lineno, node.col_offset)
        e = pos(node.end_lineno, node.end_col_offset)
        for d in getattr(node, "decorator_list", []):
            s = min(s, text.rfind("@", 0, pos(d.lineno, d.col_offset)))
        spans.append((s, e, type(node).__name__))
        if not isinstance(node, ast.stmt | ast.excepthandler):
            continue
        blocks = [
            b
            for name in ("body", "handlers", "orelse", "finalbody")
            if isinstance(b := getattr(node, name, None), list) and b and hasattr(b[0], "lineno")
        ]
        if not blocks:
            continue
        # compound statement: header (up to its colon) + blocks; `else:` / `finally:` head their block
        prev_end = s
        for i, block in enumerate(blocks):
            b0 = pos(block[0].lineno, block[0].col_offset)
            b1 = pos(block[-1].end_lineno, block[-1].end_col_offset)
            spans.append((b0, b1, "block"))
            if i == 0:
                colon = text.rfind(":", s, b0)
                if colon >= 0:
                    spans.append((s, colon + 1, "header"))
            elif (m := _CLAUSE.search(text, prev_end, b0)) is not None:
                spans.append((m.start(), m.end(), "header"))
                spans.append((m.start(), b1, "clause"))
            prev_end = b1
    return spans


class PythonBackend:
    """Python source (e.g. APPS solutions): statements are nodes, a compound statement splits into
    its header (``def f(x):``, ``for i in y:``) and body blocks, expressions inside are children and
    Python tokens are the leaves. Code that does not parse (a truncated response) is parsed as the
    longest prefix of whole lines that does; the rest becomes one node per line over its `tokenize`
    tokens. Markdown code fences are not special: the response should be code.
    """

    def parse(self, text: str) -> list[Node]:
        # Python ends a line at "\n", "\r\n" or a lone "\r" (and nowhere else, unlike
        # str.splitlines). A lone "\r" becomes "\n": same length, so every offset still indexes `text`,
        # and `ast`, `tokenize` and the line arithmetic below all see the lines Python sees.
        text = re.sub(r"\r(?!\n)", "\n", text)
        lines = text.split("\n")
        lines = [ln + "\n" for ln in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
        cut = len(lines)
        module = None
        while cut > 0:
            try:
                module = ast.parse("".join(lines[:cut]))
                break
            except (SyntaxError, ValueError):
                cut -= 1
        head = "".join(lines[:cut])
        leaves = _python_leaves(text)
        spans: list[tuple[int, int, str]] = []
        if module is not None:
            spans.extend(_ast_spans(module, head))
        pos = len(head)
        for line in lines[cut:]:  # unparsed tail: one node per line
            indent = len(line) - len(line.lstrip())
            if line.strip():
                spans.append((pos + indent, pos + len(line.rstrip()), "line"))
            pos += len(line)
        leaves = [(s, e) for s, e in leaves if text[s:e].strip()]
        return _tree_from_spans(spans, leaves, len(text))


BACKENDS: dict[str, Callable[[MacroConfig], ConstituencyBackend]] = {
    "benepar": lambda cfg: BeneparBackend(cfg.spacy_model, cfg.benepar_model),
    "spacy": lambda cfg: SpacyBackend(cfg.spacy_model),
    "python": lambda cfg: PythonBackend(),
}


def build_backend(cfg: MacroConfig) -> ConstituencyBackend:
    """The backend named by ``--parser_backend`` (loads its models now)."""
    if cfg.parser_backend not in BACKENDS:
        raise ValueError(
            f"--parser_backend must be one of {tuple(BACKENDS)}, got {cfg.parser_backend!r}"
        )
    return BACKENDS[cfg.parser_backend](cfg)


# --------------------------------------------------------------------------------------------------
# 3. the macro-action DFS


def macro_starts(trees: Sequence[Node], counter: _TokenCounter, cutoff: int) -> list[int]:
    """Start characters of the macro actions (sorted, first is 0) for the trees of one response.

    The paper's rule, depth first: a node with >= 2 leaves and fewer than `cutoff` policy tokens is one
    macro action; a larger node is split into its children; a single-leaf node joins the previous macro
    action, or the next one if none precedes it.
    """
    starts: list[int] = []

    def two_leaves(node: Node) -> bool:  # node.n_leaves() >= 2 without counting them all
        while len(node.children) == 1:
            node = node.children[0]
        return len(node.children) >= 2

    def visit(node: Node) -> None:
        if two_leaves(node):
            if counter.count(node.start, node.end) < cutoff:
                starts.append(node.start)
            else:
                for child in node.children:
                    visit(child)
        # a single leaf opens nothing: it belongs to the macro action around it

    for tree in trees:
        visit(tree)
    starts = sorted(set(starts))
    if not starts or starts[0] != 0:
        starts = [0] + starts[1:] if starts else [0]
    return starts


def segment_row(
    tokenizer: Any, backend: ConstituencyBackend, ids: Sequence[int], cutoff: int
) -> list[int]:
    """Indices (into `ids`) of the tokens that end a macro action; always includes the last token."""
    if len(ids) == 0:
        return []
    text, spans = token_char_spans(tokenizer, ids)
    if not text.strip():
        return [len(ids) - 1]
    counter = _TokenCounter(spans, len(text))
    starts = macro_starts(backend.parse(text), counter, cutoff)
    owner = []
    prev = 0
    for s, e in spans:
        if e > s:
            piece = text[s:e]
            stripped = len(piece.rstrip())
            last = s + (stripped if stripped else len(piece)) - 1
            prev = max(prev, bisect.bisect_right(starts, last) - 1)
        owner.append(prev)
    ends = [k for k in range(len(ids) - 1) if owner[k] != owner[k + 1]]
    return ends + [len(ids) - 1]


# --------------------------------------------------------------------------------------------------
# 4. the rule

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Any, backend_factory: Callable[[], ConstituencyBackend], cutoff: int):
    _WORKER.update(tokenizer=tokenizer, backend=backend_factory(), cutoff=cutoff)


def _safe_segment(
    tokenizer: Any, backend: ConstituencyBackend, ids: list[int], cutoff: int
) -> tuple[list[int] | None, str | None]:
    try:
        return segment_row(tokenizer, backend, ids, cutoff), None
    except Exception as err:  # any failure -> this row falls back to fixed n-grams
        return None, f"{type(err).__name__}: {err}"


def _segment_in_worker(ids: list[int]) -> tuple[list[int] | None, str | None]:
    return _safe_segment(_WORKER["tokenizer"], _WORKER["backend"], ids, _WORKER["cutoff"])


@register_rule("parsing")
class ParsingRule:
    """``--termination_condition parsing``: constituency-parse macro actions, per-row fallback to fixed.

    Each row's valid response ids, without a final EOS, are decoded, parsed and cut by `segment_row`.
    A final EOS joins the last macro action here (``--eos_own_macro`` then splits it off). Rows are
    parsed in a process pool of ``--parse_workers`` processes (the backend built once per worker),
    or in this process when 0 (the backend built once, now).

    Args:
        cfg: macro config (``parsing_cutoff``, ``parser_backend``, ``parse_workers``, ``ngram``).
        tokenizer: the policy's tokenizer (decodes ids; must be picklable when parse_workers > 0).
        backend_factory: zero-argument callable building the backend (default: from `cfg`); it must
            be picklable when parse_workers > 0.
        mp_context: multiprocessing start method for the pool ("spawn" is safe with CUDA/threads).
    """

    needs: frozenset[str] = frozenset()

    def __init__(
        self,
        cfg: MacroConfig,
        tokenizer: Any = None,
        backend_factory: Callable[[], ConstituencyBackend] | None = None,
        mp_context: str = "spawn",
    ) -> None:
        if tokenizer is None:
            raise ValueError("--termination_condition parsing needs the policy tokenizer")
        self.tokenizer = tokenizer
        self.cutoff = cfg.parsing_cutoff
        self.fixed = FixedRule(cfg)
        self.backend: ConstituencyBackend | None = None
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._warned: set[str] = set()
        factory = backend_factory or functools.partial(build_backend, cfg)
        self._factory = factory
        if cfg.parse_workers > 0:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=cfg.parse_workers,
                mp_context=multiprocessing.get_context(mp_context),
                initializer=_init_worker,
                initargs=(tokenizer, factory, self.cutoff),
            )
            weakref.finalize(self, self.pool.shutdown, wait=False, cancel_futures=True)
        else:
            self.backend = factory()

    def close(self) -> None:
        """Stop the worker processes (if any)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        B, A = mask.shape
        n_valid = mask.sum(1).tolist()
        eos = inputs.ends_with_eos.tolist()
        ids = inputs.response_ids.tolist()
        rows = [ids[b][: n_valid[b] - (1 if eos[b] and n_valid[b] > 0 else 0)] for b in range(B)]
        results = None
        if self.pool is not None:
            try:
                results = list(self.pool.map(_segment_in_worker, rows, chunksize=max(1, B // 16)))
            except concurrent.futures.process.BrokenProcessPool as err:
                logger.warning(
                    "parse worker pool died (%s); parsing in this process from now on", err
                )
                self.pool = None
                self.backend = self._factory()
        if results is None:
            assert self.backend is not None
            results = [_safe_segment(self.tokenizer, self.backend, r, self.cutoff) for r in rows]

        rows_idx, cols_idx, failed = [], [], []
        for b, (ends, err) in enumerate(results):
            if err is not None:
                failed.append(b)
                kind = err.split(":", 1)[0]
                if kind not in self._warned:
                    self._warned.add(kind)
                    logger.warning("parsing failed for a response, using fixed n-grams: %s", err)
                continue
            assert ends is not None
            if len(rows[b]) < n_valid[b]:  # a stripped final EOS joins the last macro action
                ends = ends[:-1]
            rows_idx.extend([b] * len(ends))
            cols_idx.extend(ends)
        macro_end = torch.zeros(B, A, dtype=torch.bool, device=mask.device)
        macro_end[
            torch.tensor(rows_idx, dtype=torch.long), torch.tensor(cols_idx, dtype=torch.long)
        ] = True
        fallback = torch.zeros(B, dtype=torch.bool, device=mask.device)
        fallback[torch.tensor(failed, dtype=torch.long)] = True
        fixed = self.fixed(inputs).macro_end
        macro_end = torch.where(fallback[:, None], fixed, macro_end)
        last = torch.arange(A, device=mask.device)[None, :] == (mask.sum(1, keepdim=True) - 1)
        return TerminationOutput(macro_end=(macro_end | last) & mask, fallback=fallback)
