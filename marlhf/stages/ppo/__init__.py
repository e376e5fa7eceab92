"""Stage 3's reinforcement learning (MA-PPO), one module per concept.

The training loop (:mod:`marlhf.stages.ppo.loop`) reads as the algorithm; each step is a module:

- :mod:`~marlhf.stages.ppo.config` — typed configuration: the four models, generation, the PPO algorithm;
- :mod:`~marlhf.stages.ppo.prompts` — the PPO prompts, the step plan, the pretraining-mix batches;
- :mod:`~marlhf.stages.ppo.models` — the actor and critic (trained; no critic for a critic-free estimator),
  the reference and reward model (frozen);
- :mod:`~marlhf.stages.ppo.rollout` — 1. generate: sample responses, pack prompt ⧺ response flush-left;
- :mod:`~marlhf.stages.ppo.scoring` — 2. score: log-probs, entropies, values, reward-model and sequence scores;
- :mod:`~marlhf.stages.ppo.experience` — 3. segment into macro actions and reward; 4. estimate advantages
  (:mod:`~marlhf.algo.estimators`, ``--advantage_estimator``; the samples of one prompt:
  :mod:`~marlhf.algo.groups`; ``macro_mc``'s Monte-Carlo continuations: :mod:`~marlhf.stages.ppo.mc`);
- :mod:`~marlhf.stages.ppo.update` — 5. update: PPO epochs of minibatches, policy and value losses;
- :mod:`~marlhf.stages.ppo.state` — checkpoints, resume, the actor's EMA, the metric tracker;
- :mod:`~marlhf.models.response_logits` — the LM head at the response positions only (scoring, update);
- :mod:`~marlhf.runtime.length_groups` — rows of similar length per forward pass (scoring, update);
- :mod:`~marlhf.runtime.resources` — CPU time and peak memory per phase (``--log_phase_resources``).

The math is pure (torch only, no DeepSpeed): :mod:`~marlhf.algo.gae`, :mod:`~marlhf.algo.losses`,
:mod:`~marlhf.algo.kl_rewards` and the packing helpers of :mod:`~marlhf.stages.ppo.rollout`. Importing this
package imports none of the modules.
"""
