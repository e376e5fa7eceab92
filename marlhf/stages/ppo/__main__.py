"""``python -m marlhf.stages.ppo``: the MA-PPO stage's command line (:mod:`marlhf.stages.ppo.main`)."""

from marlhf.stages.exits import run_program
from marlhf.stages.ppo.main import main

run_program(main)
