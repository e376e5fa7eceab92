"""``python -m marlhf.stages.reward``: the reward-model stage's command line
(:mod:`marlhf.stages.reward.train`)."""

from marlhf.stages.exits import run_program
from marlhf.stages.reward.train import main

run_program(main)
