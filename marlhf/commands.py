"""The ``marlhf`` command: every program of the project as a subcommand.

    marlhf sft --model_name_or_path tiny-base --output_dir out/sft
    marlhf ppo --actor_model_name_or_path out/sft --critic_model_name_or_path out/rm --ngram 5 ...
    marlhf infer --model_name_or_path out/ppo/actor --dataset synthetic
    marlhf view results/synthetic/temperature=0.8/out-ppo-actor.jsonl
    marlhf compare out/ppo_seed* out/mappo_seed* --label PPO --label "MA-PPO n=5"

``marlhf SUB --help`` lists a subcommand's flags. The programs keep their own entry points too
(``python -m marlhf.stages.sft``, ``inference/inference_with_rewards.py``, ``evaluation/*.py``); each
subcommand runs the same ``main``.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence

import marlhf.cli

# name -> (module, function, one line of help); modules are imported only when their command runs
COMMANDS: dict[str, tuple[str, str, str]] = {
    "sft": ("marlhf.stages.sft.train", "main", "stage 1: supervised fine-tuning"),
    "rm": ("marlhf.stages.reward.train", "main", "stage 2: reward model (end or segment scores)"),
    "ppo": ("marlhf.stages.ppo.main", "main", "stage 3: PPO / MA-PPO / GRPO / RLOO / ..."),
    "infer": ("marlhf.inference.run", "main", "sample responses and score them (RM, gold, tests)"),
    "judge": (
        "marlhf.judge.run",
        "main",
        "pairwise evaluation of two result files by an LLM judge",
    ),
    "human-eval": ("marlhf.judge.human", "main", "pairwise evaluation by hand, in the terminal"),
    "sample": ("marlhf.judge.sampling", "main", "draw the same prompts from result files"),
    "compare": ("marlhf.pipeline.compare", "main", "compare runs: curves, finals, paired results"),
    "view": ("marlhf.inference.view", "main", "show the macro actions of result files"),
    "demo": ("marlhf.pipeline.demo", "main", "the whole pipeline on the bundled tiny models"),
    "preflight": ("marlhf.pipeline.preflight", "main", "check a stage's models and data first"),
    "policy-comparisons": (
        "marlhf.data.policy_comparisons",
        "main",
        "label a policy's own answer pairs (synthetic)",
    ),  # fmt: skip
    "tiny": ("marlhf.pipeline.recipes", "main", "remake the embedded tiny models"),
}
ALIASES = {"reward": "rm", "inference": "infer", "human_eval": "human-eval"}

# name -> (module, config class, module whose docstring's first line describes the program, or None
# for the class's own) of the programs whose flags are their config class alone: the flags are
# parsed here first, from modules that import no torch, so that --help and a flag's error come in
# a fraction of a second; the program (which imports torch) then parses them again, identically.
FLAGS: dict[str, tuple[str, str, str | None]] = {
    "sft": ("marlhf.stages.sft.config", "SFTConfig", None),
    "rm": ("marlhf.stages.reward.config", "RewardStageConfig", None),
    "ppo": ("marlhf.stages.ppo.config", "PPOStageConfig", None),
    "infer": ("marlhf.inference.config", "InferenceArgs", "marlhf.inference"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, _, text) in COMMANDS.items()]
    return (
        "usage: marlhf COMMAND [flags]   (marlhf COMMAND --help lists its flags)\n\n"
        "commands:\n" + "\n".join(lines) + "\n"
    )


def parse_flags(name: str, argv: list[str]) -> None:
    """Parse command ``name``'s flags with its config class (:data:`FLAGS`) before its program is
    imported: ``--help`` prints and a bad flag exits here (argparse's ``SystemExit``)."""
    if name not in FLAGS:
        return
    module, cls, described_by = FLAGS[name]
    description = None
    if described_by is not None:
        description = (importlib.import_module(described_by).__doc__ or "").strip().splitlines()[0]
    marlhf.cli.parse_config(getattr(importlib.import_module(module), cls), argv, description)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``marlhf COMMAND [flags]``; the command's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0 if argv else 2
    name = ALIASES.get(argv[0], argv[0])
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"marlhf: error: unknown command {argv[0]}{hint}", file=sys.stderr)
        print("see marlhf --help for the commands", file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[name]
    before, marlhf.cli.PROG = marlhf.cli.PROG, f"marlhf {name}"
    try:
        parse_flags(name, argv[1:])
        result = getattr(importlib.import_module(module), function)(argv[1:])
    finally:
        marlhf.cli.PROG = before
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
