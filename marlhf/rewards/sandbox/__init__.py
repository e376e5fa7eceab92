"""The sandbox that runs untrusted Python (model-generated programs): :mod:`marlhf.rewards.sandbox.run`."""
