"""Python source as a backend (``--parser_backend python``, for code generation): statements and
expressions of the program's syntax tree are its phrases, the tokenizer's tokens its leaves.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from marlhf.macro.parsing.trees import Node

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
