"""Bradley–Terry preference loss and pairwise metrics for reward-model training.

A reward model scores a response with a scalar r; the Bradley–Terry model says the probability that
the chosen response beats the rejected one is ``σ(r_c − r_r)``. Training minimises the negative
log-likelihood of the human preferences on the *end scores* (one scalar per response). The original
DeepSpeed-Chat loss instead averaged ``logsigmoid`` over every position from the first divergent token
to the end, padding included; we do not reproduce it.

Batches arrive as the B chosen rows followed by the B rejected rows, stacked into one ``(2B, T)``
batch so a single forward pass scores both; :func:`split_pair` undoes the stacking.

Pure torch: no transformers import, so tests import it directly.

>>> import torch
>>> scores = torch.tensor([2.0, 0.5, 1.0, 0.5])  # (2B,) = chosen rows, then rejected rows
>>> chosen, rejected = split_pair(scores)
>>> chosen.tolist(), rejected.tolist()
([2.0, 0.5], [1.0, 0.5])
>>> round(float(bt_loss(chosen, rejected)), 4)  # mean(-log σ(1.0), -log σ(0.0))
0.5032
>>> preference_metrics(chosen, rejected)["accuracy"].item()  # one win, one tie counted half
0.75
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def split_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a stacked pair batch ``x: (2B, ...)`` into ``(chosen (B, ...), rejected (B, ...))``.

    The first half of the batch is the chosen responses, the second half the rejected ones (row i of
    each half belongs to the same prompt).
    """
    if x.dim() == 0 or x.shape[0] % 2 != 0:
        raise ValueError(
            f"split_pair: expected a (2B, ...) batch of chosen rows then rejected rows, "
            f"got shape {tuple(x.shape)}"
        )
    half = x.shape[0] // 2
    return x[:half], x[half:]


def bt_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coef: float = 0.0,
) -> torch.Tensor:
    """Bradley–Terry negative log-likelihood of the preferences, a scalar.

    ``loss = mean_i[-log σ(r_c,i − r_r,i − m_i)] + center_coef · mean_i[(r_c,i + r_r,i)²]``

    Args:
        chosen: ``(B,)`` scores of the preferred responses.
        rejected: ``(B,)`` scores of the dispreferred responses.
        margin: ``(B,)`` optional required score gap ``m`` (Llama-2 style margin loss: a pair rated
            "much better" asks for a larger gap); ``None`` means 0.
        center_coef: weight of the reward-centering penalty of Eisenstein et al. (2023, "Helping or
            Herding?"). The BT likelihood depends only on score differences, so the overall offset of
            the scores is free and can drift; the penalty pulls the pair mean towards 0 so scores are
            comparable across checkpoints and usable directly as a PPO reward. 0 disables it.

    Computed in float32 whatever the input dtype (``logsigmoid`` is the numerically stable form of
    ``log σ``).
    """
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(
            f"bt_loss: chosen and rejected must both be (B,), got {tuple(chosen.shape)} and "
            f"{tuple(rejected.shape)}"
        )
    if center_coef < 0:
        raise ValueError(f"bt_loss: center_coef must be >= 0, got {center_coef}")
    chosen = chosen.float()
    rejected = rejected.float()
    diff = chosen - rejected
    if margin is not None:
        if margin.shape != chosen.shape:
            raise ValueError(
                f"bt_loss: margin must be (B,) like chosen, got {tuple(margin.shape)} vs "
                f"{tuple(chosen.shape)}"
            )
        diff = diff - margin.float()
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * (chosen + rejected).pow(2).mean()
    return loss


@torch.no_grad()
def preference_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pairwise metrics of a batch of scores; each value is a detached 0-dim float32 tensor.

    Args:
        chosen: ``(B,)`` scores of the preferred responses.
        rejected: ``(B,)`` scores of the dispreferred responses.

    Returns:
        ``accuracy``: fraction of pairs with chosen > rejected; an exact tie counts 1/2 (a model that
        scores everything equally sits at chance, 0.5, rather than at 0 or 1).
        ``chosen_mean``, ``rejected_mean``: mean scores of each side.
        ``score_std``: population standard deviation of all 2B scores together.
        ``margin_mean``: mean of ``chosen − rejected``.

    Tensors (not Python floats) so a distributed caller can all-reduce them before ``.item()``.
    """
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(
            f"preference_metrics: chosen and rejected must both be (B,), got "
            f"{tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    chosen = chosen.detach().float()
    rejected = rejected.detach().float()
    wins = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
    return {
        "accuracy": wins.mean(),
        "chosen_mean": chosen.mean(),
        "rejected_mean": rejected.mean(),
        "score_std": torch.cat([chosen, rejected]).std(unbiased=False),
        "margin_mean": (chosen - rejected).mean(),
    }
