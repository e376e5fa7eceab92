"""Stage 3: MA-PPO, PPO whose advantages are estimated over macro actions (MA-RLHF, Alg. 1)
(``python -m marlhf.stages.ppo``; its command line: :mod:`~marlhf.stages.ppo.main`).

The training loop (:mod:`~marlhf.stages.ppo.loop`) reads as the algorithm; each step is a module:

- :mod:`~marlhf.stages.ppo.config` — typed configuration: the four models (composed from the shared
  parts, the actor's and critic's flags prefixed), generation, the PPO algorithm, performance;
- :mod:`~marlhf.stages.ppo.prompts` — the PPO prompts, the step plan, the pretraining-mix batches;
- :mod:`~marlhf.stages.ppo.models` — the actor and critic (trained; no critic for a critic-free
  estimator), the reference and reward model (frozen);
- :mod:`~marlhf.stages.ppo.rollout` — 1. generate: sample responses, pack prompt ⧺ response;
- :mod:`~marlhf.stages.ppo.forward` — the forward passes of scoring and of the update;
- :mod:`~marlhf.stages.ppo.scoring` — 2. score: log-probs, entropies, values, reward-model scores
  (a :class:`~marlhf.stages.ppo.scoring.Scored`) and the sequence-level reward;
- :mod:`~marlhf.stages.ppo.experience` — 3. segment into macro actions and reward; 4. estimate
  advantages through the estimator registry (:mod:`~marlhf.algo.registry`, the estimators
  :mod:`~marlhf.algo.estimators`, ``--advantage_estimator``; ``macro_mc``'s Monte-Carlo continuations: :mod:`~marlhf.stages.ppo.mc`, with ``--env``
  :mod:`~marlhf.stages.ppo.mc_env`);
- :mod:`~marlhf.stages.ppo.update` — 5. update: PPO epochs of minibatches, policy and value losses;
- :mod:`~marlhf.stages.ppo.state` — checkpoints, resume, the actor's EMA, the metric tracker.

The math is pure (torch only, no DeepSpeed) in :mod:`marlhf.algo`; where a row sits across ranks and
its seeds in :mod:`marlhf.runtime.rows`. Importing this package imports none of the modules.
"""
