"""``python -m marlhf.stages.reward``: the reward-model stage's command line
(:mod:`marlhf.stages.reward.train`)."""

from marlhf.stages.reward.train import main

main()
