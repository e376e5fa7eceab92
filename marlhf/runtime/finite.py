"""Stopping a run on a non-finite number before it reaches the weights.

A reward model or critic that returns NaN or inf, an overflow in a loss or a gradient: left alone,
the optimizer step writes NaN into every weight and the run goes on, saving NaN models. Every
stage checks instead, each optimizer step, before the optimizer step:

- PPO: the sequence rewards, the critic's values, the per-token rewards, the advantages and the
  returns of the step's experience (:func:`check_finite`, on the global batch, so every rank
  decides alike);
- every stage: the loss of each micro-batch and, at the accumulation boundary, the gradients
  (:func:`guarded_step`, in place of ``engine.step()``): the ranks agree through one small
  all-reduce per optimizer step.

A non-finite value raises :class:`NonFiniteError` naming the step and the quantity; the step's
update is not applied, and nothing is saved (the last checkpoint stays the one to resume from).
As a last guard, a model or training state is never saved with non-finite weights
(:func:`check_weights`).

Under ZeRO 1-3 the gradients live in DeepSpeed's partitions: DeepSpeed computes their norm and
skips an update whose norm is not finite (fp16 skips are its loss scaling at work and are left
to it); such a skip is reported here as the gradient norm's failure.
"""

from __future__ import annotations

import math

import torch

from marlhf.runtime.distributed import device, world_size


class NonFiniteError(RuntimeError):
    """A loss, reward, value, advantage or gradient that is NaN or infinite."""


_ADVICE = (
    "the update was not applied and nothing was saved; the last checkpoint is the one to resume "
    "from. Look at the reward model or critic (a NaN or inf head), the learning rate and the "
    "data of this step"
)


def describe_nonfinite(x: torch.Tensor | float) -> str | None:
    """What is wrong with ``x`` ("2 of 64 values are nan, 1 is +inf"), None when all is finite."""
    t = torch.as_tensor(x).detach()
    if not (t.is_floating_point() or t.is_complex()):
        return None
    finite = torch.isfinite(t)
    if bool(finite.all()):
        return None
    nan = int(torch.isnan(t).sum())
    pos = int((t == math.inf).sum())
    neg = int((t == -math.inf).sum())
    kinds = [f"{n} {k}" for n, k in ((nan, "nan"), (pos, "+inf"), (neg, "-inf")) if n]
    return f"{' and '.join(kinds)} among its {t.numel()} values"


def check_finite(step: int, values: dict[str, torch.Tensor | float | None], what: str = "") -> None:
    """Raise :class:`NonFiniteError` for the first of ``values`` (name -> tensor) that is not
    finite. Call it with the same values on every rank (global quantities), or on one process.

    >>> check_finite(3, {"rewards": torch.tensor([1.0, 2.0])})
    >>> check_finite(3, {"rewards": torch.tensor([1.0, float("nan")])})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    marlhf.runtime.finite.NonFiniteError: step 3: rewards is not finite (1 nan among its 2 values); ...
    """
    for name, x in values.items():
        if x is None:
            continue
        problem = describe_nonfinite(x)
        if problem is not None:
            raise NonFiniteError(f"step {step}: {what}{name} is not finite ({problem}); {_ADVICE}")


# --------------------------------------------------------------------------------------------------
# optimizer steps


class _Pending:
    """Per engine: the first non-finite loss of the micro-batches since its last optimizer step."""

    def __init__(self) -> None:
        self.loss: dict[int, str] = {}


_pending = _Pending()


def _grads_finite(engine) -> bool | None:
    """Whether the gradients in the module's ``.grad`` are finite (ZeRO-0, after DeepSpeed's
    all-reduce: the same on every rank); None when the module holds none there."""
    module = getattr(engine, "module", None)
    if not isinstance(module, torch.nn.Module):
        return None
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    norms = torch.stack([torch.linalg.vector_norm(g.detach(), dtype=torch.float32) for g in grads])
    return bool(torch.isfinite(norms).all())


def _any_rank(flags: list[float]) -> list[float]:
    """Element-wise max of ``flags`` over ranks (itself in one process)."""
    if world_size() == 1:
        return flags
    t = torch.tensor(flags, dtype=torch.float32, device=device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t.tolist()


def guarded_step(engine, step: int, name: str, loss: torch.Tensor) -> None:
    """``engine.step()`` for the micro-batch whose loss was ``loss`` (before scaling), after
    checking, at the accumulation boundary, that every rank's losses since the last optimizer step
    and the gradients are finite. ``step``: the optimizer step being taken (1-based, for the
    message); ``name``: what the engine is ("actor", "critic", "model"). Every rank calls it for
    every micro-batch, like ``engine.step()``."""
    key = id(engine)
    problem = describe_nonfinite(loss)
    if problem is not None and key not in _pending.loss:
        _pending.loss[key] = problem
    boundary = getattr(engine, "is_gradient_accumulation_boundary", None)
    if boundary is not None and not boundary():
        engine.step()
        return
    loss_problem = _pending.loss.pop(key, None)
    zero = bool(getattr(engine, "zero_optimization", lambda: False)())
    grads_ok = None if zero else _grads_finite(engine)
    bad_loss, bad_grads = _any_rank([float(loss_problem is not None), float(grads_ok is False)])
    if bad_loss:
        raise NonFiniteError(
            f"step {step}: the {name}'s loss is not finite "
            f"({loss_problem or 'on another rank'}); {_ADVICE}"
        )
    if bad_grads:
        raise NonFiniteError(f"step {step}: the {name}'s gradient norm is not finite; {_ADVICE}")
    engine.step()
    fp16 = bool(getattr(engine, "fp16_enabled", lambda: False)())
    skipped = zero and not getattr(engine, "_step_applied", True) and not fp16
    norm = engine.get_global_grad_norm() if hasattr(engine, "get_global_grad_norm") else None
    if skipped or (norm is not None and not math.isfinite(float(norm))):
        raise NonFiniteError(f"step {step}: the {name}'s gradient norm is not finite; {_ADVICE}")


# --------------------------------------------------------------------------------------------------
# weights


def nonfinite_tensors(named: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating tensors of ``named`` that hold a NaN or inf."""
    return [
        k
        for k, v in named.items()
        if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]


def local_weights(module: torch.nn.Module | None) -> dict[str, torch.Tensor]:
    """This rank's weights of ``module``: the parameters (a ZeRO-3 parameter's own partition);
    ``{}`` for None."""
    if not isinstance(module, torch.nn.Module):
        return {}
    out = {}
    for name, p in module.named_parameters():
        out[name] = getattr(p, "ds_tensor", None) if hasattr(p, "ds_tensor") else p.detach()
    return {k: v for k, v in out.items() if v is not None}


def check_weights(bad: list[str], what: str) -> None:
    """Refuse to save ``what`` when any rank found non-finite weights (``bad``: this rank's
    names). Collective when distributed."""
    (n_bad,) = _any_rank([float(len(bad))])
    if n_bad:
        shown = ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "") if bad else "on another rank"
        raise NonFiniteError(
            f"refusing to save {what}: its weights are not finite ({shown}); a non-finite update "
            "reached them. The checkpoints saved before are intact: resume from the last one "
            "with a lower learning rate, or look at the data of the steps after it"
        )
