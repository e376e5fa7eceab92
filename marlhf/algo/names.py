"""The names PPO's flags choose among, and what each advantage estimator needs: plain data, no torch,
so that the configuration (and ``--help``, and a flag's validation) does not import the math.

- ``--advantage_estimator``: :data:`ESTIMATOR_TRAITS` (canonical names, in registration order, with
  what each reads) and :data:`ESTIMATOR_ALIASES`; the estimators themselves are
  :mod:`marlhf.algo.estimators`, registered under these names;
- ``--kl_estimator`` / ``--kl_loss_type``: :data:`KL_ESTIMATORS` (:mod:`marlhf.algo.kl_rewards`);
- ``--ratio_level`` and ``--loss_agg_mode``: :data:`RATIO_LEVELS`, :data:`LOSS_AGG_MODES`
  (:mod:`marlhf.algo.losses`);
- ``--rollout_correction``: :data:`CORRECTIONS` (:mod:`marlhf.algo.mismatch`).

>>> resolve_estimator("reinforce++"), ESTIMATOR_TRAITS["gae"].needs_critic
('reinforce_pp', True)
"""

from __future__ import annotations

from dataclasses import dataclass

KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "macro", "sequence")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
CORRECTIONS = ("none", "tis", "mis", "seq_mask_tis")


@dataclass(frozen=True)
class EstimatorTraits:
    """What an advantage estimator reads and prescribes (the attributes of
    :class:`marlhf.algo.estimators.AdvantageEstimator`).

    Fields:
        needs_critic: reads `values` (only then is a critic built).
        needs_segments: reads `segments` (macro actions).
        needs_groups: reads `group_ids` (rows per prompt: ``--n_samples_per_prompt`` >= 2).
        needs_mc: reads `mc` (continuations at macro-action boundaries).
        batch_level: reads across rows (groups, whitening): called on the global batch.
        loss_agg_mode: the ``--loss_agg_mode`` its algorithm prescribes, or None.
    """

    needs_critic: bool = False
    needs_segments: bool = False
    needs_groups: bool = False
    needs_mc: bool = False
    batch_level: bool = False
    loss_agg_mode: str | None = None


ESTIMATOR_TRAITS: dict[str, EstimatorTraits] = {
    "gae": EstimatorTraits(needs_critic=True, needs_segments=True),
    "grpo": EstimatorTraits(needs_groups=True, batch_level=True),
    "dr_grpo": EstimatorTraits(
        needs_groups=True, batch_level=True, loss_agg_mode="seq-mean-token-sum-norm"
    ),
    "rloo": EstimatorTraits(needs_groups=True, batch_level=True),
    "reinforce_pp": EstimatorTraits(batch_level=True),
    "macro_mc": EstimatorTraits(
        needs_segments=True, needs_groups=True, needs_mc=True, batch_level=True
    ),
}

ESTIMATOR_ALIASES: dict[str, str] = {
    "group_norm": "grpo",
    "dr-grpo": "dr_grpo",
    "reinforce++": "reinforce_pp",
    "reinforce_plus_plus": "reinforce_pp",
    "macro-mc": "macro_mc",
}


def resolve_estimator(name: str) -> str:
    """The canonical name of `name` (an estimator or an alias); ValueError listing the valid names."""
    if name in ESTIMATOR_TRAITS:
        return name
    if name in ESTIMATOR_ALIASES:
        return ESTIMATOR_ALIASES[name]
    aliases = ", ".join(f"{a} = {c}" for a, c in sorted(ESTIMATOR_ALIASES.items()))
    raise ValueError(
        f"--advantage_estimator {name!r} is not known; valid: {', '.join(ESTIMATOR_TRAITS)} "
        f"(aliases: {aliases})"
    )
