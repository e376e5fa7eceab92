"""Character offsets of generated tokens in their decoded text (`token_char_spans`), without
re-tokenising: token k's span ends where the prefix decode ``decode(ids[:k+1])`` stops agreeing
with the full text, computed in O(A) from each token decoded with a few tokens of left context, as
streaming detokenizers do, checked against the full text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
