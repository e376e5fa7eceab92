"""Parse trees over a response's text: a `Node` holds character offsets into the text, a
`ConstituencyBackend` turns texts into lists of trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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


def _leaves(node: Node) -> list[Node]:
    if not node.children:
        return [node]
    return [leaf for c in node.children for leaf in _leaves(c)]
