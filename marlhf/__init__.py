"""ma-rlhf: Reinforcement Learning from Human Feedback with Macro Actions (Chai et al., ICLR 2025)."""

__version__ = "0.1.0"
