"""Stage 3's reinforcement learning (MA-PPO), one module per concept.

The training loop (:mod:`marlhf.rl.loop`) reads as the algorithm; each step is a module:

- :mod:`~marlhf.rl.config` — typed configuration: the four models, generation, the PPO algorithm;
- :mod:`~marlhf.rl.prompts` — the PPO prompts, the step plan, the pretraining-mix batches;
- :mod:`~marlhf.rl.models` — the actor and critic (trained; no critic for a critic-free estimator),
  the reference and reward model (frozen);
- :mod:`~marlhf.rl.rollout` — 1. generate: sample responses, pack prompt ⧺ response flush-left;
- :mod:`~marlhf.rl.scoring` — 2. score: log-probs, entropies, values, reward-model and sequence scores;
- :mod:`~marlhf.rl.experience` — 3. segment into macro actions and reward; 4. estimate advantages
  (:mod:`~marlhf.rl.estimators`, ``--advantage_estimator``; the samples of one prompt:
  :mod:`~marlhf.rl.groups`; ``macro_mc``'s Monte-Carlo continuations: :mod:`~marlhf.rl.mc`);
- :mod:`~marlhf.rl.update` — 5. update: PPO epochs of minibatches, policy and value losses;
- :mod:`~marlhf.rl.state` — checkpoints, resume, the actor's EMA, the metric tracker;
- :mod:`~marlhf.rl.response_logits` — the LM head at the response positions only (scoring, update);
- :mod:`~marlhf.rl.length_groups` — rows of similar length per forward pass (scoring, update);
- :mod:`~marlhf.rl.resources` — CPU time and peak memory per phase (``--log_phase_resources``).

The math is pure (torch only, no DeepSpeed): :mod:`~marlhf.rl.gae`, :mod:`~marlhf.rl.losses`,
:mod:`~marlhf.rl.rewards` and the packing helpers of :mod:`~marlhf.rl.rollout`. Importing this
package imports none of the modules.
"""
