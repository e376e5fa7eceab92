"""Per-token PPO rewards: KL penalty estimators, score placement, dense segment rewards, KL controllers.

The RLHF reward of a response (Ziegler et al. 2019; Stiennon et al. 2020) is a KL penalty on every
token plus the reward model's score on the last one:

    r_t = -beta * KL_t                    for every valid response token t
    r_t += clip(score, -c, c) [+ penalty]  on the last valid token of the row

The original MA-RLHF (DeepSpeed-Chat) put the score at index `A - 1` of every row, which with
right-padded rows of different lengths lands on padding and is lost; here it goes on each row's own last
valid token. Macro-action aggregation (averaging within a macro action) happens later, in the macro
module, on these per-token rewards. `token_rewards` and `sequence_rewards` are the two parts, for the
advantage estimators that take the score apart from the per-token terms (`marlhf.algo.estimators`).

Shapes: B batch, A response tokens, M macro actions (segments); `action_mask: (B, A) bool`, true on the
valid tokens (a prefix of each row); `segment_ids: (B, A) long`, the segment of each token, -1 on padding.

>>> import torch
>>> kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]])
>>> mask = torch.tensor([[True, True, True], [True, False, False]])
>>> compose_rewards(kl, torch.tensor([1.0, 5.0]), mask, kl_coef=0.5)
tensor([[-0.0500, -0.1000,  0.8500],
        [ 2.3000,  0.0000,  0.0000]])
"""

from __future__ import annotations

import math

import torch

from marlhf.algo.names import KL_ESTIMATORS

SPREAD_MODES = ("interpolate", "last")


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs (Schulman, "Approximating
    KL divergence", 2020). With `d = logp - ref_logp` and `r = pi_ref / pi = exp(-d)`:

    - `k1 = d`: unbiased, can be negative per token (the original MA-RLHF's choice);
    - `k2 = d^2 / 2`: biased, always >= 0, low variance;
    - `k3 = (r - 1) - log r`: unbiased (E_pi[r] = 1), always >= 0.

    Args:
        logprobs: `(B, A)` float, log pi(a_t | s_t) of the policy that sampled the tokens.
        ref_logprobs: `(B, A)` float, the reference model's log-probs of the same tokens.
        estimator: "k1", "k2" or "k3".

    Returns:
        `(B, A)` float estimates (padding positions hold garbage; mask them).

    >>> import torch
    >>> lp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    >>> [round(kl_penalty(lp, ref, k).item(), 4) for k in ("k1", "k2", "k3")]
    [1.0, 0.5, 0.3679]
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ in shape"
        )
    # float32 at least: half-precision log-probs differ in their last bits by more than a KL
    dtype = torch.promote_types(
        torch.promote_types(logprobs.dtype, ref_logprobs.dtype), torch.float32
    )
    d = logprobs.to(dtype) - ref_logprobs.to(dtype)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        # (r - 1) - log r with log r = -d; expm1 keeps precision when d is tiny (the common case).
        return torch.expm1(-d) + d
    raise ValueError(f"--kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def _last_valid_index(action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(last: (B,) long, has_any: (B,) bool)`: the position of each row's last true entry (0 where the row
    is empty). Reads the mask's true positions, so it does not rely on the prefix layout."""
    A = action_mask.shape[1]
    positions = torch.arange(A, device=action_mask.device).expand_as(action_mask)
    last = torch.where(action_mask, positions, -1).amax(dim=1)
    return last.clamp(min=0), last >= 0


def token_rewards(
    kl: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    kl_coef: float,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-token part of the rewards, `-kl_coef * kl_t (+ dense_t)` on valid tokens, 0 on padding.

    Args:
        kl: `(B, A)` float per-token KL estimates (`kl_penalty`).
        action_mask: `(B, A)` bool, valid response tokens.
        kl_coef: beta, the KL penalty coefficient (a controller's `.value`).
        dense: optional `(B, A)` float per-token rewards (e.g. `spread_segment_rewards`).

    Returns:
        `(B, A)` float rewards of dtype `promote(kl.dtype, float32)`.
    """
    B, A = action_mask.shape
    if kl.shape != (B, A):
        raise ValueError(f"kl must be (B, A) = {(B, A)} like action_mask, got {tuple(kl.shape)}")
    mask = action_mask.bool()
    dtype = torch.promote_types(kl.dtype, torch.float32)
    rewards = -kl_coef * kl.to(dtype)
    if dense is not None:
        if dense.shape != (B, A):
            raise ValueError(f"dense must be (B, A) = {(B, A)}, got {tuple(dense.shape)}")
        rewards = rewards + dense.to(dtype)
    return torch.where(mask, rewards, torch.zeros((), dtype=dtype, device=rewards.device))


def sequence_rewards(
    scores: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    reward_clip: float | None = 2.5,
    ends_with_eos: torch.Tensor | None = None,
    no_eos_penalty: float = 0.0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Each response's sequence-level reward: `clip(score, ±reward_clip) + no_eos_penalty * [row did
    not end with EOS]`, 0 for a row with no valid token. The penalty is added after clipping so that it
    still separates truncated rows when the score is clipped.

    Args:
        scores: `(B,)` float scores (reward model, possibly normalised).
        action_mask: `(B, A)` bool, valid response tokens.
        reward_clip: None disables clipping (original: 2.5).
        ends_with_eos: `(B,)` bool, true where the response ended with EOS. None = all did.
        no_eos_penalty: added to the score of rows with `ends_with_eos` false.
        dtype: result dtype (default `promote(scores.dtype, float32)`).

    Returns:
        `(B,)` float.
    """
    B = action_mask.shape[0]
    if scores.shape != (B,):
        raise ValueError(f"scores must be (B,) = ({B},), got {tuple(scores.shape)}")
    if reward_clip is not None and reward_clip <= 0:
        raise ValueError(f"--reward_clip must be > 0 or None, got {reward_clip}")
    dtype = dtype or torch.promote_types(scores.dtype, torch.float32)
    score = scores.to(dtype)
    if reward_clip is not None:
        score = score.clamp(-reward_clip, reward_clip)
    if ends_with_eos is not None:
        if ends_with_eos.shape != (B,):
            raise ValueError(
                f"ends_with_eos must be (B,) = ({B},), got {tuple(ends_with_eos.shape)}"
            )
        score = score + no_eos_penalty * (~ends_with_eos.bool()).to(dtype)
    has_any = action_mask.bool().any(1)
    return torch.where(has_any, score, torch.zeros((), dtype=dtype, device=score.device))


def compose_rewards(
    kl: torch.Tensor,
    scores: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    kl_coef: float,
    reward_clip: float | None = 2.5,
    ends_with_eos: torch.Tensor | None = None,
    no_eos_penalty: float = 0.0,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token rewards for PPO: `token_rewards` with `sequence_rewards` added on each row's last
    valid token.

    `r_t = -kl_coef * kl_t (+ dense_t)` on every valid token, and on the last valid token of each row
    additionally `clip(score, ±reward_clip) + no_eos_penalty * [row did not end with EOS]`. Pass a
    negative `no_eos_penalty` to penalise (Segment-PPO uses -0.05). Padding gets 0; a row with no valid
    token gets no score at all. Arguments as in `token_rewards` and `sequence_rewards`.

    Returns:
        `(B, A)` float32 rewards, 0 on padding.
    """
    B, A = action_mask.shape
    if scores.shape != (B,):
        raise ValueError(f"scores must be (B,) = ({B},), got {tuple(scores.shape)}")
    rewards = token_rewards(kl, action_mask, kl_coef=kl_coef, dense=dense)
    score = sequence_rewards(
        scores,
        action_mask,
        reward_clip=reward_clip,
        ends_with_eos=ends_with_eos,
        no_eos_penalty=no_eos_penalty,
        dtype=rewards.dtype,
    )
    last, _ = _last_valid_index(action_mask.bool())
    return rewards.scatter_add(1, last.unsqueeze(1), score.unsqueeze(1))


def spread_segment_rewards(
    seg_rewards: torch.Tensor, segment_ids: torch.Tensor, mode: str = "interpolate"
) -> torch.Tensor:
    """Turn per-segment rewards into per-token dense rewards (Segment-PPO, arXiv 2501.02790).

    - "interpolate": every token of segment k gets `r_k / |segment k|` (within-segment interpolation,
      so the segment's tokens sum to r_k);
    - "last": the segment's last token gets `r_k`, the others 0.

    Args:
        seg_rewards: `(B, M)` float, reward of each segment; columns past a row's segment count are
            ignored.
        segment_ids: `(B, A)` long, segment index of each token (0..count-1), -1 on padding; every id
            must be < M.

    Returns:
        `(B, A)` float dense rewards, 0 on padding.

    >>> import torch
    >>> ids = torch.tensor([[0, 0, 1, -1]])
    >>> spread_segment_rewards(torch.tensor([[1.0, 3.0]]), ids, "interpolate")
    tensor([[0.5000, 0.5000, 3.0000, 0.0000]])
    >>> spread_segment_rewards(torch.tensor([[1.0, 3.0]]), ids, "last")
    tensor([[0., 1., 3., 0.]])
    """
    if mode not in SPREAD_MODES:
        raise ValueError(f"--segment_reward_mode must be one of {SPREAD_MODES}, got {mode!r}")
    if (
        seg_rewards.dim() != 2
        or segment_ids.dim() != 2
        or seg_rewards.shape[0] != segment_ids.shape[0]
    ):
        raise ValueError(
            f"seg_rewards must be (B, M) and segment_ids (B, A) with the same B, got "
            f"{tuple(seg_rewards.shape)} and {tuple(segment_ids.shape)}"
        )
    B, A = segment_ids.shape
    M = seg_rewards.shape[1]
    valid = segment_ids >= 0
    # Padding goes to an extra bucket M, so scatters need no masking and no host sync.
    bucket = torch.where(valid, segment_ids, M).long()
    token_reward = torch.cat([seg_rewards, seg_rewards.new_zeros(B, 1)], dim=1).gather(1, bucket)
    if mode == "interpolate":
        counts = torch.zeros(B, M + 1, dtype=seg_rewards.dtype, device=seg_rewards.device)
        counts.scatter_add_(1, bucket, torch.ones_like(token_reward))
        return torch.where(valid, token_reward / counts.gather(1, bucket), 0.0)
    positions = torch.arange(A, device=segment_ids.device).expand(B, A)
    last_pos = torch.full((B, M + 1), -1, dtype=torch.long, device=segment_ids.device)
    last_pos.scatter_reduce_(1, bucket, positions, reduce="amax")
    is_last = valid & (positions == last_pos.gather(1, bucket))
    return torch.where(is_last, token_reward, 0.0)


def normalize_scores(
    scores: torch.Tensor, mean: float | torch.Tensor, std: float | torch.Tensor
) -> torch.Tensor:
    """`(scores - mean) / std`, e.g. with the reward model's score statistics over its training data
    (OpenRLHF-style reward normalisation). `mean`/`std` are floats or tensors broadcastable to `scores`
    (Segment-PPO's location-aware normaliser passes per-segment tensors).

    >>> import torch
    >>> normalize_scores(torch.tensor([1.0, 3.0]), mean=2.0, std=0.5)
    tensor([-2.,  2.])
    """
    if isinstance(std, (int, float)) and not (std > 0 and math.isfinite(std)):
        raise ValueError(f"reward normalisation std must be a positive finite number, got {std}")
    return (scores - mean) / std


class FixedKLController:
    """A constant KL coefficient (the original MA-RLHF: `--kl_ctl 0.05`).

    >>> ctl = FixedKLController(0.05)
    >>> ctl.update(current_kl=3.0, n_steps=64)
    >>> ctl.value
    0.05
    """

    def __init__(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"--kl_ctl must be >= 0, got {value}")
        self.value = float(value)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """No-op; present so trainers treat both controllers alike."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences", Sec. 2.2): a proportional controller steering the observed KL towards `target`,

        e = clip(KL / target - 1, -0.2, 0.2),    beta <- beta * (1 + e * n_steps / horizon),

    where `n_steps` is the number of samples (episodes) behind the KL measurement.

    `state_dict` holds only the current coefficient; target and horizon come from the configuration.

    >>> ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    >>> ctl.update(current_kl=12.0, n_steps=100)  # error clipped to +0.2
    >>> round(ctl.value, 6)
    0.1002
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"--init_kl_coef must be >= 0, got {init_kl_coef}")
        if not target > 0:
            raise ValueError(f"--target_kl must be > 0, got {target}")
        if not horizon > 0:
            raise ValueError(f"--kl_horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Scale the coefficient from the mean KL (per sequence) measured over `n_steps` samples."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
