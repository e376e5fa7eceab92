"""Segment-level rewards (Segment-PPO) and the normalisers saved with a reward model.

Segment-PPO (Yin et al., 2025, arXiv 2501.02790) trains a reward model whose per-position value head
is read at the last token of each *segment* (a macro action); the response score is the mean of its
segment rewards and the Bradley–Terry loss is applied to that score. In PPO each segment reward is
then normalised by where the segment sits in the response: with ``p = k/K`` the relative position of
segment k (1-based) among K segments,

    r̂ = (r − μ(p)) / σ(p),    μ(p) = a·ln p + c,    σ(p) = b·ln p + d,

with (a, b, c, d) fitted by robust (Huber) regression over the segment rewards of chosen responses.
Early segments (small p) are scored differently from late ones by such a model; the normaliser removes
that positional trend before the rewards enter GAE.

Shapes: ``B`` batch, ``T`` full sequence, ``A`` response tokens, ``M`` macro actions (segments).
Pure torch.

>>> import torch
>>> values = torch.arange(8.0).unsqueeze(0)  # (B=1, T=8): value at position t is t
>>> macro_end = torch.tensor([[False, True, False, False, True]])  # (B, A=5): segments [0,1], [2,4]
>>> rewards, mask = segment_readout(values, torch.tensor([3]), macro_end)  # response at t = 3..7
>>> rewards.tolist(), mask.tolist()  # read at t = 3+1 and t = 3+4
([[4.0, 7.0]], [[True, True]])
>>> segment_positions(mask).tolist()  # p = k/K
[[0.5, 1.0]]
>>> segment_score(rewards, mask).tolist()
[5.5]
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import torch

from marlhf.macro.segments import build_segments

# Tuning constant of the Huber loss in units of the residual scale: 95 % efficiency at the normal.
HUBER_DELTA = 1.345
# MAD / 0.6745 is a consistent estimate of the standard deviation of a normal.
_MAD_TO_STD = 1.0 / 0.6744897501960817


def segment_readout(
    values: torch.Tensor,
    response_start: torch.Tensor,
    macro_end: torch.Tensor,
    action_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one reward per segment: the value at each segment's last token.

    Args:
        values: ``(B, T) float`` per-position outputs of the reward model over the full sequence.
        response_start: ``(B,) long`` position in the full sequence of response token 0 (token j of
            the response sits at ``response_start + j``).
        macro_end: ``(B, A) bool`` true on the last token of every macro action (false on padding).
        action_mask: ``(B, A) bool`` response tokens; default: every token up to the last macro end.

    Returns:
        ``rewards: (B, M) float`` (0 on padding) and ``mask: (B, M) bool`` (a prefix of each row), with
        ``M`` the macro-action count of :func:`marlhf.macro.segments.build_segments` (the largest
        number of segments in the batch, at least 1).
    """
    if values.dim() != 2 or macro_end.dim() != 2 or response_start.shape != values.shape[:1]:
        raise ValueError(
            f"segment_readout: expected values (B, T), response_start (B,), macro_end (B, A); got "
            f"{tuple(values.shape)}, {tuple(response_start.shape)}, {tuple(macro_end.shape)}"
        )
    T = values.shape[1]
    macro_end = macro_end.bool()
    if action_mask is None:
        # Every token up to and including the last macro end of the row (a prefix mask).
        action_mask = macro_end.flip(dims=[1]).cummax(dim=1).values.flip(dims=[1])
    seg = build_segments(macro_end, action_mask.bool())
    pos = response_start.long().unsqueeze(1) + seg.end  # (B, M) position of each segment's end
    if bool(((pos >= T) & seg.mask).any()):
        raise ValueError("segment_readout: a macro-action end falls beyond the sequence length T")
    rewards = values.gather(1, pos.clamp(max=T - 1))  # (B, M)
    rewards = torch.where(seg.mask, rewards, torch.zeros_like(rewards))
    return rewards, seg.mask


def segment_positions(mask: torch.Tensor) -> torch.Tensor:
    """Relative position ``p = k/K`` of segment k (1-based) among the K segments of its row.

    ``mask: (B, M) bool`` -> ``(B, M) float``, 0 on padding.
    """
    mask = mask.bool()
    k = mask.long().cumsum(dim=1).float()
    K = mask.sum(dim=1, keepdim=True).clamp(min=1).float()
    return torch.where(mask, k / K, torch.zeros_like(k))


def segment_score(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Segment-PPO response score: mean of the valid segment rewards.

    ``rewards: (B, M) float``, ``mask: (B, M) bool`` -> ``(B,)``; a row without segments scores 0.
    """
    mask = mask.bool()
    total = torch.where(mask, rewards, torch.zeros_like(rewards)).sum(dim=1)
    return total / mask.sum(dim=1).clamp(min=1).to(total.dtype)


def huber_regression(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    delta: float = HUBER_DELTA,
    relative: bool = False,
    max_iter: int = 200,
    tol: float = 1e-10,
) -> tuple[float, float]:
    """Robust straight-line fit ``y ≈ slope·x + intercept`` minimising the Huber loss.

    Iteratively reweighted least squares: each step solves a weighted least-squares problem with
    weights ``w_i = min(1, δ·s/|e_i|)`` (the Huber ψ(e)/e), where ``e`` are the current residuals and
    ``s = MAD(e)/0.6745`` a robust residual scale re-estimated every step. Points within ``δ·s`` of the
    line count fully; farther ones grow only linearly, so a few gross outliers cannot drag the fit.
    Deterministic (closed-form steps in float64). Starts from ordinary least squares.

    Args:
        x, y: ``(N,)`` float.
        delta: Huber threshold in units of ``s`` (1.345: 95 % efficiency under normal noise).
        relative: residuals are measured relative to the fitted value, ``e_i = (y_i − ŷ_i)/ŷ_i``, and
            each point is weighted by ``1/ŷ_i²`` (for positive targets whose noise is proportional to
            their level, such as absolute residuals; without it one global threshold down-weights the
            noisier points more and flattens the slope).

    If ``x`` is constant the slope is 0 and the intercept is a Huber location estimate of ``y``.

    >>> x = torch.arange(10.0)
    >>> y = 2 * x + 1
    >>> y[3] = 100.0  # one gross outlier
    >>> [round(v, 6) for v in huber_regression(x, y)]
    [2.0, 1.0]
    """
    x = x.detach().reshape(-1).to("cpu", torch.float64)
    y = y.detach().reshape(-1).to("cpu", torch.float64)
    if x.numel() != y.numel() or x.numel() == 0:
        raise ValueError(
            f"huber_regression: need equal, non-empty x and y, got {x.numel()} and {y.numel()}"
        )
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError("huber_regression: x and y must be finite")
    # Centre x so a constant x gives a zero column (min-norm lstsq then returns slope 0).
    x_mean = x.mean()
    X = torch.stack([x - x_mean, torch.ones_like(x)], dim=1)  # (N, 2)
    w = torch.ones_like(y)
    beta = None
    for _ in range(max_iter):
        sw = w.sqrt()
        new = torch.linalg.lstsq(X * sw[:, None], (y * sw)[:, None], driver="gelsd").solution[:, 0]
        converged = beta is not None and bool(
            (new - beta).abs().max() <= tol * (1 + beta.abs().max())
        )
        beta = new
        if converged:
            break
        fitted = X @ beta
        resid = y - fitted
        if relative:
            level = fitted.clamp(min=1e-6 * float(y.abs().max()) + 1e-300)
            resid = resid / level
        resid = resid.abs()
        scale = resid.median() * _MAD_TO_STD
        if scale <= 0:  # more than half the points lie exactly on the line
            break
        w = (delta * scale / resid.clamp(min=1e-300)).clamp(max=1.0)
        if relative:
            w = w / level.pow(2)
    slope, intercept = float(beta[0]), float(beta[1] - beta[0] * x_mean)
    return slope, intercept


@functools.lru_cache(maxsize=8)
def half_normal_huber_factor(delta: float = HUBER_DELTA, n: int = 20_001) -> float:
    """Huber location estimate (as computed by :func:`huber_regression`) of ``sqrt(π/2)·|Z|``.

    ``Z ~ N(0, 1)``; evaluated on ``n`` exact quantiles of the half-normal, so deterministic. The mean
    of ``sqrt(π/2)·|Z|`` is 1, but the distribution is skewed right and the Huber estimate sits below
    it (about 0.95 for δ = 1.345); dividing by this factor makes the σ fit consistent.
    """
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    y = torch.special.ndtri(0.5 + 0.5 * u) * math.sqrt(math.pi / 2)  # half-normal quantiles
    _, location = huber_regression(torch.zeros_like(y), y, delta=delta)
    return location


@dataclass(frozen=True)
class LocationNormalizer:
    """Location-aware segment-reward normaliser: ``(r − μ(p)) / σ(p)``.

    ``μ(p) = a·ln p + c`` and ``σ(p) = max(b·ln p + d, sigma_floor)`` with ``p = k/K ∈ (0, 1]``.
    At the last segment (p = 1) the mean is c and the std d.
    """

    a: float
    b: float
    c: float
    d: float
    sigma_floor: float = 1e-3

    def mean(self, positions: torch.Tensor) -> torch.Tensor:
        """``μ(p)`` for ``positions: (...) float`` in (0, 1]."""
        return self.a * _safe_log(positions) + self.c

    def std(self, positions: torch.Tensor) -> torch.Tensor:
        """``σ(p)``, floored at ``sigma_floor``, for ``positions: (...) float`` in (0, 1]."""
        return (self.b * _safe_log(positions) + self.d).clamp(min=self.sigma_floor)

    def apply(
        self,
        rewards: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        clip: float | None = None,
    ) -> torch.Tensor:
        """Normalise segment rewards.

        Args:
            rewards: ``(B, M) float`` segment rewards.
            positions: ``(B, M) float`` ``p = k/K`` (see :func:`segment_positions`).
            mask: optional ``(B, M) bool``; padding entries come out 0.
            clip: optional bound c: the result is clamped to ``[-c, c]`` (Segment-PPO uses 10).
        """
        positions = positions.to(rewards.dtype)
        out = (rewards - self.mean(positions)) / self.std(positions)
        if clip is not None:
            out = out.clamp(-clip, clip)
        if mask is not None:
            out = torch.where(mask.bool(), out, torch.zeros_like(out))
        return out

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LocationNormalizer:
        floor = float(d.get("sigma_floor", cls.sigma_floor))
        return cls(
            a=float(d["a"]), b=float(d["b"]), c=float(d["c"]), d=float(d["d"]), sigma_floor=floor
        )


def _safe_log(p: torch.Tensor) -> torch.Tensor:
    # Padding carries p = 0; keep ln finite there (the caller masks those entries).
    return torch.log(p.clamp(min=torch.finfo(p.dtype).tiny))


def fit_location_normalizer(
    rewards: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    delta: float = HUBER_DELTA,
    sigma_floor: float = 1e-3,
) -> LocationNormalizer:
    """Fit ``μ(p) = a·ln p + c`` and ``σ(p) = b·ln p + d`` to segment rewards of chosen responses.

    1. μ: Huber regression of r on ln p gives (a, c).
    2. σ: Huber regression of ``|r − μ(p)|·sqrt(π/2)`` on ln p gives (b, d). For a normal residual
       ``E|x| = σ·sqrt(2/π)``, so the scaled absolute residual has expectation σ(p): a regression of it
       on ln p is a regression of σ. Two refinements make the fit consistent (it recovers the true
       b, d on data drawn from the model; the plain recipe came out ~20 % flat on the slope in our
       synthetic check): the regression measures residuals relative to the fitted σ (the noise of
       an absolute residual is proportional to σ(p)), and (b, d) are divided by
       :func:`half_normal_huber_factor`, the amount by which a Huber fit of the skewed half-normal
       falls short of its mean.

    Args:
        rewards: ``(B, M)`` (or any shape) segment rewards.
        positions: same shape, ``p = k/K`` in (0, 1].
        mask: optional bool of the same shape selecting valid entries (all if ``None``).
        delta: Huber threshold (see :func:`huber_regression`).
        sigma_floor: lower bound on σ(p) when the normaliser is applied.
    """
    if rewards.shape != positions.shape:
        raise ValueError(
            f"fit_location_normalizer: rewards {tuple(rewards.shape)} and positions "
            f"{tuple(positions.shape)} must have the same shape"
        )
    if mask is not None:
        if mask.shape != rewards.shape:
            raise ValueError(
                f"fit_location_normalizer: mask {tuple(mask.shape)} must match rewards "
                f"{tuple(rewards.shape)}"
            )
        rewards, positions = rewards[mask.bool()], positions[mask.bool()]
    r = rewards.detach().reshape(-1).to("cpu", torch.float64)
    p = positions.detach().reshape(-1).to("cpu", torch.float64)
    if r.numel() < 2:
        raise ValueError(
            f"fit_location_normalizer: need at least 2 segment rewards, got {r.numel()}"
        )
    if bool(((p <= 0) | (p > 1)).any()):
        raise ValueError("fit_location_normalizer: positions must lie in (0, 1] (p = k/K)")
    log_p = torch.log(p)
    a, c = huber_regression(log_p, r, delta=delta)
    abs_resid = (r - (a * log_p + c)).abs() * math.sqrt(math.pi / 2)
    b, d = huber_regression(log_p, abs_resid, delta=delta, relative=True)
    kappa = half_normal_huber_factor(delta)
    b, d = b / kappa, d / kappa
    return LocationNormalizer(a=a, b=b, c=c, d=d, sigma_floor=sigma_floor)


@dataclass(frozen=True)
class ScoreStats:
    """Mean and (population) standard deviation of reward-model end scores over the eval split.

    PPO can standardise rewards with them: ``(score − mean) / std``.
    """

    mean: float
    std: float

    @classmethod
    def from_scores(cls, scores: torch.Tensor) -> ScoreStats:
        """Statistics of ``scores: (N,)``."""
        s = scores.detach().reshape(-1).to("cpu", torch.float64)
        if s.numel() == 0:
            raise ValueError("ScoreStats.from_scores: no scores")
        return cls(mean=float(s.mean()), std=float(s.std(unbiased=False)))

    def normalize(self, scores: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """``(scores − mean) / max(std, eps)``, any shape."""
        return (scores - self.mean) / max(self.std, eps)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ScoreStats:
        return cls(mean=float(d["mean"]), std=float(d["std"]))
