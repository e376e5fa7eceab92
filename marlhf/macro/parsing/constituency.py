"""The Berkeley constituency parser as a backend (``--parser_backend benepar``), and reading its
Penn-Treebank brackets back into character spans of the text (`bracketed`).
"""

from __future__ import annotations

import re
from typing import Any

from marlhf.macro.parsing.sentences import split_sentences
from marlhf.macro.parsing.trees import Node

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

    >>> from marlhf.macro.parsing.trees import _leaves
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
