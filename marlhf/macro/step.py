"""The ``step`` termination rule (declared in :mod:`marlhf.macro.rules`): a reasoning step is one
macro action, as step-level credit methods cut chains of thought (SPO, VinePPO): a macro action
ends at the token that holds the last character of each match of ``--step_delimiter`` (a regular
expression, a newline by default) in the response's text, and at the last valid token.

The text is each token decoded on its own and concatenated, so a delimiter that spans tokens is
found, and each row is cut from its own tokens alone (the cut is the same in any batch and on any
split over ranks). Decoding a token alone can differ from decoding it in context where a tokenizer
merges or strips spaces; a delimiter of newlines and punctuation is not affected.

>>> import torch
>>> class Chars:  # a tokenizer whose tokens are characters
...     def decode(self, ids, **kw):
...         return "".join(chr(i) for i in ids)
>>> from marlhf.macro.config import MacroConfig
>>> rule = StepRule(MacroConfig(termination_condition="step"), Chars())
>>> ids = torch.tensor([[ord(c) for c in "1+1\\n=2\\nok"]])
>>> from marlhf.macro.termination import TerminationInputs
>>> out = rule(TerminationInputs(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([False])))
>>> out.macro_end.nonzero()[:, 1].tolist()  # after each newline and at the last token
[3, 6, 8]
"""

from __future__ import annotations

import bisect
import re
from typing import Any

import torch

from marlhf.macro.rules import Step, register_rule
from marlhf.macro.termination import TerminationInputs, TerminationOutput


@register_rule("step")
class StepRule(Step):
    """Cuts each row at the matches of ``--step_delimiter`` in its decoded text."""

    def __init__(self, cfg: Any, tokenizer: Any = None) -> None:
        if tokenizer is None:
            raise ValueError(
                "termination rule 'step' decodes the response: build it with the tokenizer"
            )
        self.pattern = re.compile(cfg.step_delimiter)
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}  # token id -> its text decoded alone

    def _text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def row_ends(self, ids: list[int]) -> list[int]:
        """Indices of the tokens of ``ids`` that end a step (the last token not included unless a
        match ends there)."""
        starts, text = [], []
        offset = 0
        for t in ids:
            piece = self._text(t)
            starts.append(offset)
            text.append(piece)
            offset += len(piece)
        joined = "".join(text)
        ends = set()
        for m in self.pattern.finditer(joined):
            if m.end() == m.start():
                continue
            # the token whose text holds the match's last character: the last start at or before it
            ends.add(bisect.bisect_right(starts, m.end() - 1) - 1)
        return sorted(ends)

    def __call__(self, inputs: TerminationInputs) -> TerminationOutput:
        mask = inputs.action_mask
        macro_end = torch.zeros_like(mask)
        n_valid = mask.sum(1).tolist()
        for b, n in enumerate(n_valid):
            if n == 0:
                continue
            ids = inputs.response_ids[b, :n].tolist()
            for j in self.row_ends(ids):
                macro_end[b, j] = True
            macro_end[b, n - 1] = True
        return TerminationOutput(macro_end=macro_end & mask)
