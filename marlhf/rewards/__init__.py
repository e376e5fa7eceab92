"""Rewards besides a reward model's end score: segment rewards and their normalisers, execution
rewards for code, and the sandbox that runs the code."""
