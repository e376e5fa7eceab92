"""PPO losses: masked statistics, the clipped policy surrogate (token- or macro-level ratio), the clipped
value loss, explained variance and the entropy bonus.

Shapes: B batch, A response tokens; `action_mask: (B, A) bool` true on valid tokens;
`segment_ids: (B, A) long`, the macro action of each token (0..count-1), -1 on padding.

Stats are returned as detached 0-d tensors (no host sync in the training step); convert with `.item()`
when logging.

>>> import torch
>>> lp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, (padding)
>>> old = torch.zeros(1, 3)
>>> adv = torch.tensor([[1.0, 1.0, 9.0]])
>>> mask = torch.tensor([[True, True, False]])
>>> loss, stats = policy_loss(lp, old, adv, mask, cliprange=0.2)
>>> round(loss.item(), 4)  # mean(-min(1.5, 1.2), -min(0.5, 0.8)) = mean(-1.2, -0.5)
-0.85
>>> stats["policy/clipfrac"].item()  # only the first token is clipped
0.5
"""

from __future__ import annotations

import torch

from marlhf.algo.names import LOSS_AGG_MODES, RATIO_LEVELS


def masked_mean(
    x: torch.Tensor,
    mask: torch.Tensor,
    dim: int | tuple[int, ...] | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean of `x` over entries where `mask` is true (over all of them, or along `dim`).

    Masked-out entries are excluded even if they hold NaN/inf. An empty selection gives 0 (not NaN), so a
    batch whose rows are all padding contributes nothing to a loss. `count` (only with `dim=None`)
    replaces the denominator: the number of entries of a batch split over data-parallel ranks makes the
    result this part's share of the whole batch's mean (the shares sum to it).

    >>> import torch
    >>> masked_mean(torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[True, True, False]]))
    tensor(1.5000)
    """
    mask = mask.bool()
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return total.sum() / (mask.sum().clamp(min=1) if count is None else count)
    if count is not None:
        raise ValueError("masked_mean: count is only supported with dim=None")
    return total.sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over the masked entries (Bessel-corrected when `unbiased` and more than one entry).

    >>> import torch
    >>> masked_var(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([True, True, False]))
    tensor(2.)
    """
    mask = mask.bool()
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).square(), mask)
    if unbiased:
        n = mask.sum()
        var = var * n / (n - 1).clamp(min=1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise `x` to unit variance over the masked entries (and zero mean if `shift_mean`; otherwise the
    mean is kept, as is usual for advantages that should keep their sign balance). Padding becomes 0.

    >>> import torch
    >>> masked_whiten(torch.tensor([1.0, 3.0, 7.0]), torch.tensor([True, True, False]))
    tensor([-0.7071,  0.7071,  0.0000])
    """
    mask = mask.bool()
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # the statistics in float32 at least
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=out.device))


def agg_loss(
    terms: torch.Tensor,
    weight: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_terms: torch.Tensor | None = None,
    num_seqs: torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce per-term losses `(B, A)` to a scalar (verl's ``loss_agg_mode`` names). A "term" is an entry
    where `weight` is true: a token, or a macro action's first token at the macro ratio level.

    - ``token-mean``: `sum(terms) / num_terms` — every term weighs the same (the default).
    - ``seq-mean-token-sum``: `sum_i sum_t terms_{i,t} / num_seqs`.
    - ``seq-mean-token-mean``: `sum_i mean_t terms_{i,t} / num_seqs` — every sequence weighs the same
      (GRPO's and GSPO's published objectives).
    - ``seq-mean-token-sum-norm``: `sum_i sum_t terms_{i,t} / (num_seqs * norm_length)` — Dr. GRPO's
      constant normaliser (the maximum response length) in place of each sequence's length, so no
      length bias. verl divides a micro-batch's sum by the length and leaves the division by the number
      of sequences to its gradient accumulation; here both are explicit, so the loss does not depend on
      how the minibatch is split.

    `num_terms` and `num_seqs` default to this batch's counts (terms; rows with at least one term). A
    data-parallel trainer passes the counts of the whole minibatch over all ranks: each rank's loss is
    then its share, and the shares sum to the whole minibatch's loss in every mode (a sequence's terms
    are never split over ranks).

    Args:
        terms: (B, A) float; entries where `weight` is false are ignored (may hold NaN/inf).
        weight: (B, A) bool.
        mode: one of `LOSS_AGG_MODES`.
        norm_length: the constant of ``seq-mean-token-sum-norm`` (required there; e.g.
            ``--max_answer_seq_len``).

    >>> import torch
    >>> x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    >>> w = torch.tensor([[True, True, True], [True, False, False]])
    >>> [agg_loss(x, w, m, norm_length=4).item() for m in LOSS_AGG_MODES]
    [2.5, 5.0, 3.0, 1.25]
    """
    if mode == "token-mean":
        return masked_mean(terms, weight, count=num_terms)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"--loss_agg_mode must be one of {LOSS_AGG_MODES}, got {mode!r}")
    weight = weight.bool()
    per_term = torch.where(weight, terms, torch.zeros((), dtype=terms.dtype, device=terms.device))
    seq_sum = per_term.sum(1)  # (B,)
    if num_seqs is None:
        num_seqs = weight.any(1).sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum / weight.sum(1).clamp(min=1)).sum() / num_seqs
    if norm_length is None or not norm_length > 0:
        raise ValueError(
            "--loss_agg_mode seq-mean-token-sum-norm needs a positive constant normaliser "
            f"(norm_length: the maximum response length, --max_answer_seq_len), got {norm_length}"
        )
    return seq_sum.sum() / (num_seqs * norm_length)


def _check_same_shape(reference: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != reference.shape:
            raise ValueError(
                f"{name} must have shape {tuple(reference.shape)} like action_mask, got {tuple(t.shape)}"
            )


def _macro_layout(
    mask: torch.Tensor, segment_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(valid, bucket, first, is_first) of a macro batch: `bucket` (B, A) the macro index of each
    token (A on padding), `first` (B, A + 1) each macro action's first token index, `is_first` (B, A)
    true on the first token of every macro action."""
    B, A = mask.shape
    valid = mask & (segment_ids >= 0)
    # A macro action has >= 1 token, so ids are < A: A buckets plus bucket A for padding suffice,
    # and no host sync is needed to learn M.
    bucket = torch.where(valid, segment_ids, A).long()
    positions = torch.arange(A, device=mask.device).expand(B, A)
    first = torch.full((B, A + 1), A, dtype=torch.long, device=mask.device)
    first.scatter_reduce_(1, bucket, positions, reduce="amin")
    is_first = valid & (positions == first.gather(1, bucket))  # (B, A): one per macro action
    return valid, bucket, first, is_first


def policy_terms(
    action_mask: torch.Tensor, ratio_level: str = "token", segment_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, A) bool: where `policy_loss` places its terms, every valid token (token and sequence
    levels) or the first token of every macro action (macro level). Its `.sum()` is the count the
    ``token-mean`` policy loss is a mean over and `.any(1).sum()` the number of sequences of the
    ``seq-mean-*`` modes, so a trainer can count the terms of a whole minibatch split over ranks.

    >>> import torch
    >>> ids = torch.tensor([[0, 0, 1, -1]])
    >>> policy_terms(ids >= 0, "macro", ids).int().tolist()
    [[1, 0, 1, 0]]
    """
    if ratio_level in ("token", "sequence"):
        return action_mask.bool()
    if ratio_level != "macro":
        raise ValueError(f"--ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    if segment_ids is None:
        raise ValueError("--ratio_level macro needs segment_ids (B, A)")
    return _macro_layout(action_mask.bool(), segment_ids)[3]


def _ratio_terms(
    token_log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ratio_level: str,
    segment_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_ratio, adv, weight), each (B, A): the log-ratio and advantage of every term and where the
    terms are, at the chosen ratio level (see `policy_loss`)."""
    if ratio_level == "token":
        return token_log_ratio, advantages, mask  # one term per valid token
    if ratio_level == "sequence":
        # GSPO (Zheng et al. 2025): s_i = exp(mean_t log(pi/pi_old)) over the row's valid tokens. The
        # GSPO-token form s_{i,t} = sg[s_i] * pi_t / sg[pi_t] has the value s_i (so clipping acts per
        # sequence) and the gradient s_i * grad log pi_t: with a constant advantage per sequence and
        # seq-mean-token-mean it is exactly GSPO's sequence-level gradient.
        n = mask.sum(1, keepdim=True).clamp(min=1)
        seq_log_ratio = token_log_ratio.sum(1, keepdim=True) / n  # (B, 1)
        log_ratio = seq_log_ratio.detach() + token_log_ratio - token_log_ratio.detach()
        return log_ratio, advantages, mask
    if ratio_level != "macro":
        raise ValueError(f"--ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    if segment_ids is None:
        raise ValueError("--ratio_level macro needs segment_ids (B, A)")
    _check_same_shape(mask, segment_ids=segment_ids)
    B, A = mask.shape
    valid, bucket, first, is_first = _macro_layout(mask, segment_ids)
    zero = torch.zeros((), dtype=token_log_ratio.dtype, device=mask.device)
    macro_log_ratio = torch.zeros(B, A + 1, dtype=token_log_ratio.dtype, device=mask.device)
    macro_log_ratio.scatter_add_(1, bucket, torch.where(valid, token_log_ratio, zero))
    # Each macro action's terms sit on its first token; the other tokens get weight 0.
    log_ratio = macro_log_ratio.gather(1, bucket)
    adv = advantages.gather(1, first.gather(1, bucket).clamp(max=A - 1))
    return log_ratio, adv, is_first


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    cliprange: float,
    ratio_level: str = "token",
    segment_ids: torch.Tensor | None = None,
    num_terms: torch.Tensor | None = None,
    num_tokens: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    num_seqs: torch.Tensor | None = None,
    norm_length: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, `agg(max(-A * rho, -A * clip(rho, 1 - eps, 1 + eps)))`.

    - `ratio_level="token"`: one ratio per token, `rho_t = exp(logp_t - old_logp_t)`. With macro-action
      advantages broadcast to tokens this is what the original MA-RLHF trained.
    - `ratio_level="macro"`: one ratio per macro action omega, the ratio of the macro action's probability
      (MA-RLHF, Eq. 3), `rho_omega = exp(sum_{t in omega} (logp_t - old_logp_t))`, clipped, times the macro
      advantage; one term per macro action. The advantage is read at the macro action's first token
      (macro-level GAE broadcasts one per macro action). With one-token macro actions this equals the
      token level exactly.
    - `ratio_level="sequence"`: GSPO's length-normalised sequence ratio
      `s_i = exp(mean_{t valid} (logp_t - old_logp_t))`, clipped per sequence, in its token form (one
      term per token with value s_i and gradient s_i * grad logp_t). GSPO's published objective is
      this with `loss_agg_mode="seq-mean-token-mean"`. With one-token responses all levels agree.

    Args:
        logprobs: `(B, A)` float, log-probs under the policy being trained (carries the gradient).
        old_logprobs: `(B, A)` float, log-probs recorded at rollout time.
        advantages: `(B, A)` float (constant within each macro action for the macro level).
        action_mask: `(B, A)` bool.
        cliprange: epsilon (original: 0.2).
        ratio_level: "token", "macro" or "sequence".
        segment_ids: `(B, A)` long, required for the macro level; tokens with id -1 are ignored.
        num_terms, num_tokens: denominators of the means over the terms (`policy_terms(...).sum()`)
            and over the tokens (`policy/approx_kl`); default this batch's own counts. A data-parallel
            trainer passes the counts of the whole minibatch over all ranks: the loss and stats are
            then this rank's shares, which sum over ranks to the whole minibatch's means.
        loss_agg_mode, num_seqs, norm_length: how the terms reduce to the loss (`agg_loss`;
            ``token-mean``, the default, is the mean over the terms); `num_seqs` is the minibatch's
            number of sequences over all ranks (`policy_terms(...).any(1).sum()`) for the seq modes.
        is_weights: `(B, A)` float without gradient, or None: each term's loss is multiplied by the
            weight on its token (the rollout correction's importance weights,
            `marlhf.algo.mismatch.importance_weights`, which give every token its term's weight).

    Returns:
        `(loss: 0-d tensor, stats)` with stats `policy/clipfrac` (fraction of ratios, tokens or macro
        actions, whose clipped term is the active one), `policy/approx_kl` (`mean((r - 1) - log r)` over
        tokens, r the per-token ratio), `policy/ratio_mean` (mean ratio at the chosen level); the
        stats are means over the terms whatever `loss_agg_mode`.
    """
    _check_same_shape(
        action_mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages
    )
    if cliprange < 0:
        raise ValueError(f"--cliprange must be >= 0, got {cliprange}")
    mask = action_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    token_log_ratio = torch.where(mask, logprobs - old_logprobs, zero)  # (B, A)
    log_ratio, adv, weight = _ratio_terms(
        token_log_ratio, advantages, mask, ratio_level, segment_ids
    )

    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    terms = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        _check_same_shape(action_mask, is_weights=is_weights)
        terms = terms * is_weights.detach().to(terms.dtype)
    loss = agg_loss(
        terms,
        weight,
        loss_agg_mode,
        num_terms=num_terms,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )

    with torch.no_grad():
        stats = {
            "policy/clipfrac": masked_mean(
                (clipped > unclipped).to(ratio.dtype), weight, count=num_terms
            ),
            "policy/approx_kl": masked_mean(
                torch.expm1(token_log_ratio) - token_log_ratio, mask, count=num_tokens
            ),
            "policy/ratio_mean": masked_mean(ratio, weight, count=num_terms),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    cliprange_value: float,
    num_tokens: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    num_seqs: torch.Tensor | None = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss, `0.5 * mean(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2))` over valid
    tokens. For macro-action PPO the returns are the macro returns broadcast to the macro's tokens (each
    token's value regresses to its macro action's return, as in the original).

    Args:
        values: `(B, A)` float, current critic values (carries the gradient).
        old_values: `(B, A)` float, values recorded at rollout time.
        returns: `(B, A)` float, regression targets.
        action_mask: `(B, A)` bool.
        cliprange_value: c (original: 0.2).
        num_tokens: the denominator of the means (default: this batch's valid tokens); the count of
            a whole minibatch split over ranks makes the loss this rank's share (see `policy_loss`).
        loss_agg_mode, num_seqs, norm_length: the reduction over tokens (`agg_loss`; default
            ``token-mean``, the mean over valid tokens); `num_seqs`: the minibatch's non-empty rows.

    Returns:
        `(loss, {"value/clipfrac": fraction of tokens where the clipped error is the larger})`.

    >>> import torch
    >>> v, old, ret = torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[2.0, 1.0]])
    >>> loss, stats = value_loss(v, old, ret, torch.ones(1, 2, dtype=torch.bool), cliprange_value=0.5)
    >>> loss.item()  # 0.5 * mean(max(1, 1.5^2), max(1, 1))
    0.8125
    """
    _check_same_shape(action_mask, values=values, old_values=old_values, returns=returns)
    if cliprange_value < 0:
        raise ValueError(f"--cliprange_value must be >= 0, got {cliprange_value}")
    mask = action_mask.bool()
    clipped_values = old_values + torch.clamp(
        values - old_values, -cliprange_value, cliprange_value
    )
    err = (values - returns).square()
    err_clipped = (clipped_values - returns).square()
    loss = 0.5 * agg_loss(
        torch.maximum(err, err_clipped),
        mask,
        loss_agg_mode,
        num_terms=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    with torch.no_grad():
        clipfrac = masked_mean((err_clipped > err).to(err.dtype), mask, count=num_tokens)
    return loss, {"value/clipfrac": clipfrac.detach()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """`1 - Var[R - V] / Var[R]` over the masked entries: 1 is a perfect critic, 0 no better than a constant,
    negative worse. NaN when the returns have no variance. Meant for logging (syncs to the host).

    >>> import torch
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> explained_variance(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0]]), m)
    1.0
    """
    with torch.no_grad():
        values, returns = values.detach().double(), returns.detach().double()
        var_returns = masked_var(returns, mask)
        if var_returns.item() == 0.0:
            return float("nan")
        return float(1.0 - masked_var(returns - values, mask) / var_returns)


def entropy_bonus(
    entropy: torch.Tensor, action_mask: torch.Tensor, num_tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean per-token entropy over valid tokens (`(B, A)` from `marlhf.models.logprobs.entropy_from_logits`);
    subtract `coef * entropy_bonus(...)` from the loss to encourage exploration (the original uses none).
    `num_tokens`: the denominator (default: this batch's valid tokens; see `policy_loss`).

    >>> import torch
    >>> entropy_bonus(torch.tensor([[1.0, 3.0, 50.0]]), torch.tensor([[True, True, False]]))
    tensor(2.)
    """
    return masked_mean(entropy, action_mask, count=num_tokens)
