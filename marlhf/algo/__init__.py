"""The math of RLHF as pure functions over tensors (torch only): GAE and macro-action GAE, KL
rewards, PPO losses, advantage estimators, prompt groups, the Bradley–Terry loss."""
