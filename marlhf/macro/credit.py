"""Which tokens a macro action's advantage trains (``--macro_credit``).

``all`` (MA-RLHF): every token of macro action w_k carries its advantage A_k into the policy loss.
``boundary`` (SPO's probability mask, arXiv 2505.23564 §3.3): only the macro action's boundary token
does; the other tokens are left out of the policy loss (not given a zero advantage: they do not count
in its means either, as SPO normalises by the number of masked-in tokens). The boundary token is the
token the rule cut at, as the rule says (:meth:`marlhf.macro.rules.Rule.boundary`):

- ``lowprob`` with ``--lowprob_cut after``: the low-probability token that ends the macro action (its
  last token; for the response's last macro action, the last token);
- ``lowprob`` with ``--lowprob_cut before``, ``entropy`` and ``ppl``: the uncertain token that opens
  the macro action (its first token);
- ``fixed``, ``randomized`` and ``parsing``, whose cuts mark no token as a decision: the first token,
  the action taken at the state s_k whose value is the macro action's baseline.

With ``macro_mc`` a credit segment (the macro actions between two Monte-Carlo boundaries) shares one
advantage, which then trains the boundary token of every macro action in it, as SPO applies a
segment's advantage to every cut point inside it. The estimators that give one advantage per response
(grpo, dr_grpo, rloo, reinforce_pp) have no macro advantages to place.

>>> import torch
>>> from marlhf.macro.segments import build_segments
>>> seg = build_segments(torch.tensor([[0, 1, 0, 0, 1]]).bool(), torch.ones(1, 5).bool())
>>> fixed, lowprob = MacroConfig(), MacroConfig(termination_condition="lowprob")
>>> boundary_tokens(seg, fixed).int().tolist(), boundary_tokens(seg, lowprob).int().tolist()
([[1, 0, 1, 0, 0]], [[0, 1, 0, 0, 1]])
"""

from __future__ import annotations

import torch

from marlhf.macro.config import MacroConfig
from marlhf.macro.rules import rule_class
from marlhf.macro.segments import MacroSegments

__all__ = ["boundary_position", "boundary_tokens", "credit_mask"]


def boundary_position(macro: MacroConfig) -> str:
    """``"first"`` or ``"last"``: where the boundary token of the macro actions of ``macro``'s
    rule sits, with its flags."""
    return rule_class(macro.termination_condition).boundary(macro)


def boundary_tokens(segments: MacroSegments, macro: MacroConfig) -> torch.Tensor:
    """(B, A) bool: the boundary token of every macro action of ``segments`` (one per macro action;
    false on padding), cut by the rule of ``macro``."""
    ids = segments.ids
    valid = ids >= 0
    positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
    at = segments.end if boundary_position(macro) == "last" else segments.start
    return valid & (positions == at.gather(1, ids.clamp(min=0)))


def credit_mask(segments: MacroSegments, macro: MacroConfig) -> torch.Tensor:
    """(B, A) bool: the tokens whose advantage enters the policy loss under ``--macro_credit``:
    every response token (``all``) or the boundary tokens (``boundary``)."""
    if macro.macro_credit == "all":
        return segments.ids >= 0
    if macro.macro_credit != "boundary":
        raise ValueError(
            f"--macro_credit must be one of ('all', 'boundary'), got {macro.macro_credit!r}"
        )
    return boundary_tokens(segments, macro)
