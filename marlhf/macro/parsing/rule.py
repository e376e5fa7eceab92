"""The parsing rule (``--termination_condition parsing``, registered as ``parsing``): step 3 of the
pipeline (:mod:`marlhf.macro.parsing`), the macro-action DFS over each row's trees, and the rule that
runs it per row (in a process pool when asked), falling back to ``fixed`` for a row that fails.

Example, with a hand-written bracketed tree and a word-level "tokenizer" whose tokens are the words:

>>> from marlhf.macro.parsing.constituency import bracketed
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

import bisect
import concurrent.futures
import functools
import logging
import multiprocessing
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from marlhf.macro.config import MacroConfig
from marlhf.macro.parsing.constituency import BeneparBackend
from marlhf.macro.parsing.dependency import SpacyBackend
from marlhf.macro.parsing.python_code import PythonBackend
from marlhf.macro.parsing.spans import _TokenCounter, token_char_spans
from marlhf.macro.parsing.trees import ConstituencyBackend, Node
from marlhf.macro.rules import Parsing, register_rule
from marlhf.macro.termination import FixedRule, TerminationInputs, TerminationOutput

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# 2. the backends by name

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
class ParsingRule(Parsing):
    """``--termination_condition parsing``: constituency-parse macro actions, per-row fallback to fixed
    (its description, flags and label: :class:`marlhf.macro.rules.Parsing`).

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
