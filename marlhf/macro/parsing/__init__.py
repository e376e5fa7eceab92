"""Parsing-based termination (MA-RLHF Sec. 3.1): constituency spans of the response become macro
actions. The rule's name, description, flags and label are declared with the other rules
(:class:`marlhf.macro.rules.Parsing`); this package, with its parser backends, is imported when the
rule is first built, and registers its implementation (:mod:`~marlhf.macro.parsing.rule`).

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
"""

from marlhf.macro.parsing.constituency import BeneparBackend, bracketed
from marlhf.macro.parsing.dependency import SpacyBackend, dependency_trees
from marlhf.macro.parsing.python_code import PythonBackend
from marlhf.macro.parsing.rule import ParsingRule, build_backend, macro_starts, segment_row
from marlhf.macro.parsing.sentences import split_sentences
from marlhf.macro.parsing.spans import token_char_spans
from marlhf.macro.parsing.trees import ConstituencyBackend, Node

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
