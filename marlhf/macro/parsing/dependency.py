"""spaCy's dependency parse as a backend (``--parser_backend spacy``): each head's subtree is a
phrase.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marlhf.macro.parsing.constituency import _load_spacy, _pipe
from marlhf.macro.parsing.sentences import split_sentences
from marlhf.macro.parsing.trees import Node


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
