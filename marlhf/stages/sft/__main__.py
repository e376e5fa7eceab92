"""``python -m marlhf.stages.sft``: the SFT stage's command line (:mod:`marlhf.stages.sft.train`)."""

from marlhf.stages.exits import run_program
from marlhf.stages.sft.train import main

run_program(main)
