"""What a training run stands on: the process group, DeepSpeed engines and their JSON config,
deterministic batching across ranks, metrics tracking, checkpoints and their files."""
