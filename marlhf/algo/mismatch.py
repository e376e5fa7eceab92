"""Rollout–trainer log-prob mismatch: how far the rollout engine's record of log π_old is from the
trainer's own forward pass over the same tokens, and the importance weights that correct for it.

The rollout engine (the static decoder, `marlhf.models.decode`, or any engine that fills
``Rollout.logprobs``) samples token a_t from π_rollout and records log π_rollout(a_t | s_t). The
trainer scores the same tokens with its own forward pass: log π_trainer(a_t | s_t), the same weights
but other kernels (one token at a time against the whole sequence, bf16 rounding in another order).
With ``ρ = π_trainer / π_rollout`` (per token: ``ρ_t = exp(log π_trainer − log π_rollout)``):

- metrics: ``|log π_trainer − log π_rollout|`` (mean, max over valid tokens), the k3 estimate of
  KL(π_rollout ‖ π_trainer) (``ρ − 1 − log ρ`` averaged over tokens sampled from π_rollout), and the
  min/max of ρ per token, per macro action (the product of its tokens' ρ) and per sequence (the
  product over the response);
- correction (decoupled PPO: π_old is the trainer's score, the clipped ratio is π_θ / π_old, and each
  loss term is weighted by the importance weight ``w`` of π_old against the sampler). ``w`` is ρ at
  the ratio level the policy loss uses (`marlhf.algo.losses.policy_loss`): ρ_t per token, the product
  over a macro action, or exp(mean_t log ρ_t) per sequence (GSPO's length-normalised ratio), then

  - ``tis``: truncated, ``min(ρ, C)`` (truncated importance sampling; verl's token/sequence
    ``rollout_is`` weights, OpenRLHF's ``tis`` upper bound);
  - ``mis``: masked, ``ρ · 1[1/C ≤ ρ ≤ C]`` (terms outside the band are dropped; OpenRLHF's
    ``icepop``, verl's rejection-sampling mask);
  - ``seq_mask_tis``: ``min(ρ, C) · 1[1/C ≤ g ≤ C]`` with ``g = exp(mean_t log ρ_t)`` the response's
    geometric-mean ratio: whole responses outside the band are dropped (OpenRLHF's
    ``seq-mask-tis``), the others truncated.

  ``C`` is ``--rollout_is_cap``. The weights carry no gradient (they are ratios of two fixed
  scores).

Shapes: B rows, A response tokens; ``action_mask: (B, A) bool``; ``segment_ids: (B, A) long``, the
macro action of each token, −1 on padding.

>>> import torch
>>> trainer = torch.tensor([[0.0, 0.0, 0.0]])
>>> rollout = torch.log(torch.tensor([[0.5, 2.0, 1.0]]))   # ρ = 2, 0.5, 1
>>> mask = torch.ones(1, 3, dtype=torch.bool)
>>> importance_weights(trainer, rollout, mask, mode="tis", cap=1.5).tolist()
[[1.5, 0.5, 1.0]]
>>> importance_weights(trainer, rollout, mask, mode="mis", cap=1.5).tolist()
[[0.0, 0.0, 1.0]]
"""

from __future__ import annotations

import torch

from marlhf.algo.names import CORRECTIONS


def _valid(mask: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
    mask = mask.bool()
    return mask if segment_ids is None else mask & (segment_ids >= 0)


def level_log_ratio(
    log_rho: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, A) float: each token's log-ratio at ``level``, broadcast to the tokens it covers.

    ``token``: log ρ_t itself; ``macro``: Σ_{t ∈ ω} log ρ_t of the token's macro action ω
    (``segment_ids`` needed); ``sequence``: mean_t log ρ_t over the row's valid tokens (GSPO);
    ``sequence_sum``: Σ_t log ρ_t over the row (the response's probability ratio). 0 on padding.

    >>> lr = torch.tensor([[0.1, 0.2, 0.4, 9.0]])
    >>> m = torch.tensor([[True, True, True, False]])
    >>> level_log_ratio(lr, m, "macro", torch.tensor([[0, 0, 1, -1]])).tolist()
    [[0.30000001192092896, 0.30000001192092896, 0.4000000059604645, 0.0]]
    """
    valid = _valid(mask, segment_ids if level == "macro" else None)
    x = torch.where(valid, log_rho, torch.zeros((), dtype=log_rho.dtype, device=log_rho.device))
    if level == "token":
        return x
    if level in ("sequence", "sequence_sum"):
        total = x.sum(1, keepdim=True)  # (B, 1)
        if level == "sequence":
            total = total / valid.sum(1, keepdim=True).clamp(min=1)
        return torch.where(valid, total.expand_as(x), torch.zeros_like(x))
    if level != "macro":
        raise ValueError(f"unknown ratio level {level!r} (token, macro, sequence, sequence_sum)")
    if segment_ids is None:
        raise ValueError("the macro ratio level needs segment_ids (B, A)")
    B, A = x.shape
    bucket = torch.where(valid, segment_ids, A).long()  # padding -> bucket A
    sums = torch.zeros(B, A + 1, dtype=x.dtype, device=x.device).scatter_add_(1, bucket, x)
    return torch.where(valid, sums.gather(1, bucket), torch.zeros_like(x))


def importance_weights(
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    mode: str,
    cap: float,
    level: str = "token",
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, A) float32 weights of the policy-loss terms (see the module docstring), 0 on padding,
    each token carrying its term's weight (one per macro action or sequence at those levels), no
    gradient. ``mode`` one of :data:`CORRECTIONS` (``none``: 1 on valid tokens); ``cap`` C > 1."""
    if mode not in CORRECTIONS:
        raise ValueError(f"--rollout_correction must be one of {CORRECTIONS}, got {mode!r}")
    if not cap > 1.0:
        raise ValueError(f"--rollout_is_cap must be > 1, got {cap}")
    mask = action_mask.bool()
    with torch.no_grad():
        log_rho = trainer_logprobs.detach().float() - rollout_logprobs.detach().float()
        if mode == "none":
            return mask.float()
        rho = torch.exp(level_log_ratio(log_rho, mask, level, segment_ids))
        log_cap = torch.log(torch.tensor(cap, dtype=torch.float32, device=rho.device))
        if mode == "tis":
            w = rho.clamp(max=cap)
        elif mode == "mis":
            w = rho * (level_log_ratio(log_rho, mask, level, segment_ids).abs() <= log_cap)
        else:  # seq_mask_tis
            geo = level_log_ratio(log_rho, mask, "sequence")
            w = rho.clamp(max=cap) * (geo.abs() <= log_cap)
        return torch.where(mask, w, torch.zeros_like(w))


def mismatch_metrics(
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    segment_ids: torch.Tensor | None = None,
) -> dict[str, float]:
    """The ``rollout/*`` metrics of one batch (floats; syncs to the host):
    ``logprob_diff_mean``, ``logprob_diff_max`` (|log π_trainer − log π_rollout| over valid tokens),
    ``k3_kl`` (mean of ρ − 1 − log ρ, KL(π_rollout ‖ π_trainer)), and ``ratio_{min,max}_{token,
    macro,seq}`` (ρ per token, per macro action with ``segment_ids``, per response: the product of
    its tokens' ρ). An empty batch gives 0 diffs and ratios of 1."""
    mask = action_mask.bool()
    log_rho = trainer_logprobs.detach().double() - rollout_logprobs.detach().double()
    out: dict[str, float] = {}
    if not mask.any():
        out.update({"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0})
        out["rollout/k3_kl"] = 0.0
        for lvl in ("token", "macro", "seq"):
            out[f"rollout/ratio_min_{lvl}"] = out[f"rollout/ratio_max_{lvl}"] = 1.0
        return out
    d = log_rho[mask]
    out["rollout/logprob_diff_mean"] = float(d.abs().mean())
    out["rollout/logprob_diff_max"] = float(d.abs().max())
    out["rollout/k3_kl"] = float((torch.expm1(d) - d).mean())
    levels = {"token": (log_rho, mask)}
    if segment_ids is not None:
        macro = level_log_ratio(log_rho, mask, "macro", segment_ids)
        levels["macro"] = (macro, _valid(mask, segment_ids))
    seq = level_log_ratio(log_rho, mask, "sequence_sum")
    levels["seq"] = (seq[:, :1], mask.any(1, keepdim=True))
    for lvl, (x, m) in levels.items():
        out[f"rollout/ratio_min_{lvl}"] = float(torch.exp(x[m].min()))
        out[f"rollout/ratio_max_{lvl}"] = float(torch.exp(x[m].max()))
    return out
