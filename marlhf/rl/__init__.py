"""The RL stage: rollout, experience, advantage estimators and the update."""
