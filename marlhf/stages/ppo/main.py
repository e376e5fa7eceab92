"""Stage 3: MA-PPO — PPO whose advantages are estimated over macro actions (MA-RLHF, Alg. 1).

Four models: the actor (from SFT) and the critic (from the RM) train as DeepSpeed engines; the
reference (frozen SFT) and the reward model (frozen RM) only run forward. The algorithm lives in
:mod:`marlhf.stages.ppo` (the loop: :mod:`marlhf.stages.ppo.loop`); this is its command line.

Run::

    python -m marlhf.stages.ppo --actor_model_name_or_path out/sft --critic_model_name_or_path out/rm \
        --termination_condition fixed --ngram 5 --output_dir out/ppo
"""

from __future__ import annotations

from marlhf.cli import parse_config
from marlhf.stages.common import run_stage
from marlhf.stages.exits import run_program
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.ppo.loop import train

__all__ = ["PPOStageConfig", "main", "train"]


def main(argv: list[str] | None = None) -> None:
    run_stage(train, parse_config(PPOStageConfig, argv))


if __name__ == "__main__":
    run_program(main)
