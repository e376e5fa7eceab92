"""Stage 2: the reward model (``python -m marlhf.stages.reward``; :mod:`~marlhf.stages.reward.train`)."""
