"""``python -m tests.support.short_demo [DEMO FLAGS] --rm_steps N --label_prompts M``: the demo
(:mod:`marlhf.pipeline.demo`, every stage as ``python -m marlhf.demo`` runs it) with two of its
sizes cut for a check that must be cheap: the reward-model stage stops after ``N`` optimizer steps
(``--max_steps``) and ``M`` train prompts get their two labelled SFT answers (instead of the task's
own count). Everything else, the flags of every stage, ``--dtype`` and the report included, is the
demo's."""

from __future__ import annotations

import argparse
import dataclasses

from marlhf.pipeline import demo


def shortened(rm_steps: int, label_prompts: int) -> None:
    """Cut every demo task's reward-model stage to ``rm_steps`` steps and its labelling to
    ``label_prompts`` prompts (in place: the demo reads the same table)."""
    for name, task in list(demo.TASKS.items()):
        rm = [*task.rm, "--max_steps", str(rm_steps)]
        demo.TASKS[name] = dataclasses.replace(task, rm=rm, label_prompts=label_prompts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rm_steps", type=int, required=True)
    parser.add_argument("--label_prompts", type=int, required=True)
    ours, rest = parser.parse_known_args(argv)
    shortened(ours.rm_steps, ours.label_prompts)
    demo.main(rest)


if __name__ == "__main__":
    main()
