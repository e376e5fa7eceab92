"""Your own reward in Python: ``--reward_fn path/to/file.py:name`` or ``--reward_fn module:name``
(repeatable; ``--reward_weights`` weighs them), TRL's convention::

    def my_reward(prompts: list[str], completions: list[str], **columns) -> list[float | None]:
        ...

``prompts`` are the B prompts' texts (the task's own text, before any chat template),
``completions`` the B responses (decoded without special tokens), and every other column of the
rows' dataset arrives as a keyword list of B values (None where a row lacks it): a local file's
columns besides ``prompt``, ``chosen``, ``rejected``, ``margin``, ``id`` and ``messages``, or a
reasoning-gym task's ``answer`` and ``metadata``. A function without ``**columns`` gets only the
columns it names. It returns one value per row: an int or float, or None (no reward from this
function for that row: its share of that row's reward is left out). ``async def`` functions are
awaited, all of a batch's together (``asyncio.gather``).

Each function's mean over the rows it scored is logged as ``reward/<name>`` (its Python name; the
file's name is added when two share one). A function that raises, returns a value that is not a
finite number, or not B values, stops the run with one ``error:`` line naming it, the row and the
value (:class:`marlhf.rewards.registry.RewardError`); ``--reward_errors zero`` scores those 0 and
counts them in ``reward/errors``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marlhf.rewards.terms import RewardBatch, RewardTerm, check_values, refuse


def _load_module(where: str, spec: str):
    """The module of ``--reward_fn``'s ``where`` part: a Python file, or an importable module."""
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"--reward_fn {spec}: {path.resolve()} does not exist")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        name = f"marlhf_reward_{path.stem}_{digest}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"--reward_fn {spec}: {path} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up here
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise ValueError(
                f"--reward_fn {spec}: loading {path} raised {type(e).__name__}: {e}"
            ) from e
        return module
    try:
        return importlib.import_module(where)
    except ImportError as e:
        raise ValueError(
            f"--reward_fn {spec}: no module {where!r} ({e}); give a file as path/to/file.py:name "
            "or a module on the Python path as module:name"
        ) from e


def load_reward_function(spec: str) -> Callable:
    """The function ``--reward_fn`` names: ``path/to/file.py:name`` or ``module:name``
    (ValueError naming the flag when the file, module or name is not there)."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise ValueError(
            f"--reward_fn {spec!r}: give path/to/file.py:name or module:name (the function's name "
            "after the last ':')"
        )
    module = _load_module(where, spec)
    fn = getattr(module, attr, None)
    if fn is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"--reward_fn {spec}: {where} has no {attr!r} (its functions: {', '.join(found) or 'none'})"
        )
    if not callable(fn):
        raise ValueError(f"--reward_fn {spec}: {attr} is a {type(fn).__name__}, not a function")
    return fn


def _keywords(fn: Callable) -> tuple[bool, list[str], list[str]]:
    """(takes ``**columns``, the column parameters it names, those of them without a default):
    the parameters after the first two (prompts, completions)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: give it every column
        return True, [], []
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    rest = positional[2:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
    names = [p.name for p in rest]
    required = [p.name for p in rest if p.default is p.empty]
    return var_kw, names, required


@dataclass(frozen=True)
class RewardFunction:
    """One ``--reward_fn``: ``spec`` as given, the function, its metric name and weight."""

    spec: str
    fn: Callable
    name: str
    weight: float = 1.0

    def missing_columns(self, columns: Sequence[str]) -> list[str]:
        """The columns the function requires (parameters without a default) not in ``columns``."""
        _, _, required = _keywords(self.fn)
        return [c for c in required if c not in columns]

    def arguments(self, columns: dict[str, list]) -> dict[str, list]:
        """The keyword lists it is called with: every column, or those it names."""
        var_kw, names, _ = _keywords(self.fn)
        # copies: a function that changes its lists changes nothing another function reads
        return {k: list(v) for k, v in columns.items() if var_kw or k in names}


def reward_functions(specs: Sequence[str], weights: Sequence[float]) -> tuple[RewardFunction, ...]:
    """The functions of ``--reward_fn`` with their ``--reward_weights`` (1 each when none are
    given), each named by its Python name, with the file's (or module's) name in front when two
    share one."""
    fns = [load_reward_function(s) for s in specs]
    plain = [getattr(f, "__name__", type(f).__name__) for f in fns]
    names = [
        f"{Path(spec.rpartition(':')[0]).stem}.{name}" if plain.count(name) > 1 else name
        for spec, name in zip(specs, plain, strict=True)
    ]
    if len(set(names)) < len(names):
        raise ValueError(f"--reward_fn names one function twice: {list(specs)}")
    w = list(weights) or [1.0] * len(fns)
    return tuple(
        RewardFunction(s, f, n, float(x)) for s, f, n, x in zip(specs, fns, names, w, strict=True)
    )


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def call_all(functions: Sequence[RewardFunction], batch: RewardBatch) -> list[Any]:
    """What each function returns for ``batch`` (or :class:`_Raised`): sync ones in turn, then the
    async ones together (``asyncio.gather`` in one event loop)."""
    columns = batch.columns()
    out: list[Any] = [None] * len(functions)
    pending: dict[int, Any] = {}
    for i, f in enumerate(functions):
        try:
            result = f.fn(list(batch.prompts), list(batch.completions), **f.arguments(columns))
        except Exception as e:  # noqa: BLE001 - reported with the function's name
            out[i] = _Raised(e)
            continue
        if inspect.isawaitable(result):
            pending[i] = result
        else:
            out[i] = result

    async def gather() -> list[Any]:
        return await asyncio.gather(*pending.values(), return_exceptions=True)

    if pending:
        for i, result in zip(pending, asyncio.run(gather()), strict=True):
            out[i] = _Raised(result) if isinstance(result, BaseException) else result
    return out


@dataclass(frozen=True)
class FunctionRewards:
    """The ``--reward_fn`` functions as reward terms, one per function, checked by
    :func:`marlhf.rewards.terms.check_values`."""

    functions: tuple[RewardFunction, ...]
    errors: str = "raise"

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        terms = []
        for f, result in zip(self.functions, call_all(self.functions, batch), strict=True):
            who = f"--reward_fn {f.spec}"
            if isinstance(result, _Raised):
                e = result.exc
                refuse(self.errors, f"{who} raised {type(e).__name__}: {e} (on the batch of "
                       f"{len(batch)} rows starting with {batch.row(0)})")  # fmt: skip
                # every row 0 and counted (scored, so that every step logs the same metrics)
                values, scored = torch.zeros(len(batch)), torch.ones(len(batch), dtype=torch.bool)
                n_errors = len(batch)
            else:
                values, scored, n_errors = check_values(who, result, batch, self.errors)
            terms.append(RewardTerm(f.name, values, scored, f.weight, errors=n_errors))
        return terms
