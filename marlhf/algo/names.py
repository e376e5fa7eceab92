"""The names PPO's flags choose among: plain data, no torch, so that the configuration (and
``--help``, and a flag's validation) does not import the math.

- ``--kl_estimator`` / ``--kl_loss_type``: :data:`KL_ESTIMATORS` (:mod:`marlhf.algo.kl_rewards`);
- ``--ratio_level`` and ``--loss_agg_mode``: :data:`RATIO_LEVELS`, :data:`LOSS_AGG_MODES`
  (:mod:`marlhf.algo.losses`);
- ``--rollout_correction``: :data:`CORRECTIONS` (:mod:`marlhf.algo.mismatch`).

The names of ``--advantage_estimator``, with what each estimator reads and prescribes, are its
registry's (:mod:`marlhf.algo.registry`).

>>> "seq-mean-token-sum-norm" in LOSS_AGG_MODES, KL_ESTIMATORS
(True, ('k1', 'k2', 'k3'))
"""

from __future__ import annotations

KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "macro", "sequence")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
CORRECTIONS = ("none", "tis", "mis", "seq_mask_tis")
