"""Checks that run before any model is loaded: do the models and data exist, is a directory the kind
of model its flag expects, and do the models of one run share one tokenizer.

Run once before launching ranks (every ``training/step*/training_scripts/run_*.sh`` does this before
``deepspeed``), with the stage's own flags::

    python -m marlhf.preflight sft --model_name_or_path google/gemma-2b --data_path ...
    python -m marlhf.preflight rm --model_name_or_path out/sft --data_path ...
    python -m marlhf.preflight ppo --actor_model_name_or_path out/sft --critic_model_name_or_path out/rm
    marlhf preflight infer --model_name_or_path out/ppo/actor --dataset data/eval.jsonl

The stages are named as the ``marlhf`` command names them (``sft``, ``rm``, ``ppo``; ``reward`` is
``rm``, as ``marlhf reward`` is).

It prints one line per problem, each naming the flag, the model or data path and what to do, and
exits with status 2 (0 when everything is in place), in seconds, instead of every rank failing
with its own traceback. What it checks:

* a local-looking path (``/``, ``./``, ``../``, ``~``, more than one ``/``, a first component that
  exists here, ...) that does not exist: "does not exist";
* a hub id that is not in the local Hugging Face cache while ``HF_HUB_OFFLINE=1`` is set (or the
  hub cannot be reached): named with the cache directory and the variable;
* a directory that is not a model (no ``config.json``), a reward-model directory
  (``reward_config.json``) given as a causal LM (actor, reference, SFT base), and a critic or reward
  model that is not a reward-model directory;
* stage 3: actor, reference, critic and reward model with different tokenizers (vocabulary size,
  special token ids, whether BOS is added, a hash of the vocabulary), or an embedding smaller than
  the actor's vocabulary; the critic and the reward model read the actor's token ids, so they must
  share its tokenizer (:func:`check_same_tokenizer`, also called by the PPO stage itself);
* data: a local ``--data_path`` entry that does not exist, or a name that is no known dataset;
  a local file whose columns (after ``--data_columns``) fit no known schema;
* ``infer`` (``marlhf infer``'s flags): the policy (``--model_name_or_path``), the reward model if
  one is given, ``--max_prompt_seq_len`` + ``--max_answer_seq_len`` against their context, and
  ``--dataset`` as above.

Hub datasets are not looked up (``datasets`` has its own cache and offline rules); they fail, with
their name, when the stage loads them.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import marlhf.cli
from marlhf.cli import parse_config
from marlhf.data.adapters import ADAPTERS, ALIASES, get_adapter
from marlhf.data.gym import gym_problem, is_gym_spec
from marlhf.data.sources import columns_problem
from marlhf.inference.config import InferenceArgs
from marlhf.inference.models import model_problems
from marlhf.inference.naming import dataset_spec
from marlhf.models.checks import (
    check_same_tokenizer,
    critic_head,
    critic_problem,
    ppo_model_roles,
    settings_mismatches,
)
from marlhf.models.context import context_problem
from marlhf.models.sources import looks_local, model_source_problem, reward_dir_problem
from marlhf.pipeline.memory_plan import GiB, format_plan, ppo_plan, split_plan_flags
from marlhf.rewards.registry import reads_reward_model
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.reward.config import RewardStageConfig
from marlhf.stages.sft.config import SFTConfig

# --- data -----------------------------------------------------------------------------------------
_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".tsv", ".txt", ".arrow", ".gz")


def data_problem(
    spec: str, data_columns: Sequence[str] = (), flag: str = "--data_path"
) -> str | None:
    """A ``--data_path`` entry (the data flag ``flag``) that is a missing local path or no known
    dataset, or a local file whose columns (renamed by ``--data_columns``) fit no known schema;
    else None."""
    p = _data_problem(spec, data_columns)
    if p is not None and flag != "--data_path":
        p = re.sub(r"^--data_path\b", flag, p)
    return p


def _data_problem(spec: str, data_columns: Sequence[str]) -> str | None:
    mapping = {theirs: ours for ours, theirs in (m.split("=", 1) for m in data_columns)}
    if is_gym_spec(spec) and not os.path.exists(spec):
        return gym_problem(spec)
    if os.path.exists(spec):
        return columns_problem(spec, mapping)
    if ":" in spec:
        head, rest = spec.split(":", 1)
        if ALIASES.get(head, head) in ADAPTERS:
            if os.path.exists(rest):
                return columns_problem(spec, mapping)
            return f"--data_path {spec}: {os.path.abspath(os.path.expanduser(rest))} does not exist"
    if looks_local(spec) or spec.lower().endswith(_DATA_SUFFIXES):
        return f"--data_path {spec}: {os.path.abspath(os.path.expanduser(spec))} does not exist"
    try:
        get_adapter(spec)
    except ValueError as e:
        return str(e)
    return None


# --- the command ----------------------------------------------------------------------------------
# the stages by the names of their ``marlhf`` commands, and the other names those accept
STAGES = {
    "sft": SFTConfig,
    "rm": RewardStageConfig,
    "ppo": PPOStageConfig,
    "infer": InferenceArgs,
}
STAGE_ALIASES = {"reward": "rm"}


def _stage_config(stage: str) -> type:
    return STAGES[STAGE_ALIASES.get(stage, stage)]


def _model_checks(stage: str, cfg: Any) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(flag, model, kind) to check; kind: ``causal`` (no reward-model dir), ``reward`` (must be
    one), ``model`` (any model directory) or ``tokenizer``; and the problems of flags that cannot
    work together (a critic with a trained head from a model that has none, no reward model with
    ``--reward_source rm``)."""
    out: list[tuple[str, str, str]] = []
    problems: list[str] = []
    if stage in ("sft", "rm"):
        m = cfg.model
        out.append(
            ("--model_name_or_path", m.model_name_or_path, "causal" if stage == "sft" else "model")
        )
        if m.tokenizer_name_or_path:
            out.append(("--tokenizer_name_or_path", m.tokenizer_name_or_path, "tokenizer"))
        ref = getattr(cfg.reward, "reference_model_name_or_path", None) if stage == "rm" else None
        if ref:
            out.append(("--reference_model_name_or_path", ref, "causal"))
        return out, problems
    mc, source = cfg.models, cfg.reward_source
    critic = mc.critic.model.model_name_or_path
    out.append(("--actor_model_name_or_path", mc.actor.model.model_name_or_path, "causal"))
    if mc.reference_model_name_or_path:
        out.append(("--reference_model_name_or_path", mc.reference_model_name_or_path, "causal"))
    # the critic and the reward model (a critic not given is the actor, checked above)
    head = critic_head(mc, source) if cfg.ppo.needs_critic else None
    if head and critic:
        out.append(
            ("--critic_model_name_or_path", critic, "reward" if head == "trained" else "model")
        )
    elif head:
        problem = critic_problem(mc, source)
        if problem:
            problems.append(problem)
    if reads_reward_model(source):
        if mc.reward_model_name_or_path:
            out.append(("--reward_model_name_or_path", mc.reward_model_name_or_path, "reward"))
        elif not critic:
            problems.append(
                f"--reward_source {source} needs a reward model: pass the output of stage 2 as "
                "--reward_model_name_or_path"
            )
        elif head != "trained":  # a trained critic's check covers its reward model too
            flag = "--reward_model_name_or_path (not given: --critic_model_name_or_path)"
            out.append((flag, critic, "reward"))
    return out, problems


def _model_problem(flag: str, name: str, kind: str, probe_network: bool) -> str | None:
    """What is wrong with one model of :func:`_model_checks`, or None."""
    if kind == "reward" and not os.path.isdir(name):
        # reward models are read from local directories only
        return (
            f"{flag} {name}: the directory {os.path.abspath(name)} does not exist; pass the "
            "output directory of stage 2 (marlhf.stages.reward)"
        )
    p = model_source_problem(
        name, flag, probe_network=probe_network, tokenizer_only=kind == "tokenizer"
    )
    if p is None and kind in ("causal", "reward") and os.path.isdir(name):
        p = reward_dir_problem(name, flag, want_reward=kind == "reward")
        if p and flag == "--critic_model_name_or_path":
            p += ", or start the critic from this model with --critic_value_head fresh"
    return p


def infer_problems(args: InferenceArgs) -> list[str]:
    """``marlhf infer``'s models (the policy, the reward model) and lengths
    (:func:`marlhf.inference.models.model_problems`) and its ``--dataset``."""
    cfg = args.inference
    problems = model_problems(cfg)
    p = data_problem(dataset_spec(cfg.dataset), cfg.data.data_columns, flag="--dataset")
    return problems + [p] if p else problems


def preflight(stage: str, cfg: Any, *, probe_network: bool = True) -> list[str]:
    """Every problem with the models and data of a parsed stage config (empty: all in place);
    ``stage``: ``sft``, ``rm`` (or ``reward``) or ``ppo``."""
    stage = STAGE_ALIASES.get(stage, stage)
    if stage == "infer":
        return infer_problems(cfg)
    checks, problems = _model_checks(stage, cfg)
    problems = [p for f, n, k in checks if (p := _model_problem(f, n, k, probe_network))] + problems
    for spec in cfg.data.data_path:
        p = data_problem(spec, cfg.data.data_columns)
        if p:
            problems.append(p)
    if not problems:
        p = _context_problem(stage, cfg)
        if p:
            problems.append(p)
    if stage == "ppo" and not problems and not cfg.models.allow_settings_mismatch:
        roles = ppo_model_roles(cfg.models, cfg.reward_source)
        problems += [
            f"{p}: pass the same setting, or --allow_settings_mismatch"
            for p in settings_mismatches(roles, vars(cfg.data))
        ]
    if stage == "ppo" and not problems:
        trust = cfg.models.shared.trust_remote_code
        try:
            check_same_tokenizer(
                ppo_model_roles(cfg.models, cfg.reward_source), trust_remote_code=trust
            )
        except (ValueError, OSError) as e:
            problems.append(str(e))
    return problems


def _context_problem(stage: str, cfg: Any) -> str | None:
    """The sequence-length flags against the context of the stage's models
    (:mod:`marlhf.models.context`)."""
    if stage in ("sft", "rm"):
        models = {"--model_name_or_path": cfg.model.model_name_or_path}
        if stage == "rm" and cfg.reward.reference_model_name_or_path:
            models["--reference_model_name_or_path"] = cfg.reward.reference_model_name_or_path
        return context_problem(models, {"--max_seq_len": cfg.data.max_seq_len})
    g = cfg.generation
    lengths = {
        "--max_prompt_seq_len": g.max_prompt_seq_len,
        "--max_answer_seq_len": g.max_answer_seq_len,
    }
    return context_problem(ppo_model_roles(cfg.models, cfg.reward_source), lengths)


def print_plan(cfg: Any, opts: dict) -> list[str]:
    """``--plan``: prints the per-GPU memory plan of a PPO run (`marlhf.pipeline.memory_plan`); a
    problem when it does not fit ``--gpu_memory``."""
    plan = ppo_plan(cfg, opts["num_gpus"], opts["gpu_memory_gb"])
    print(format_plan(plan))
    if plan.fits is False:
        return [
            f"the plan needs {plan.total / GiB:.1f} GiB per GPU, more than --gpu_memory "
            f"{opts['gpu_memory_gb']:g}: add GPUs (--num_gpus), raise --actor_zero_stage / "
            "--critic_zero_stage, --offload, LoRA, activation checkpointing or smaller batches"
        ]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m marlhf.preflight STAGE [stage flags]``: 0 when the run can start, 2 otherwise.
    Stage ``ppo`` also takes ``--plan --num_gpus N [--gpu_memory GB]``: the memory plan
    (`marlhf.pipeline.memory_plan`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = marlhf.cli.PROG or "python -m marlhf.preflight"
    if argv and argv[0] in ("-h", "--help"):
        print(
            f"usage: {prog} {{{','.join(STAGES)}}} [stage flags...] [--config FILE]\n\n"
            f"{__doc__.strip()}"
        )
        raise SystemExit(0)
    if not argv or STAGE_ALIASES.get(argv[0], argv[0]) not in STAGES:
        if not argv or argv[0].startswith("-"):
            problem = f"name the stage to check first: {', '.join(STAGES)}"
        else:
            close = difflib.get_close_matches(argv[0], [*STAGES, *STAGE_ALIASES], n=1)
            hint = f" (did you mean {STAGE_ALIASES.get(close[0], close[0])}?)" if close else ""
            problem = f"unknown stage {argv[0]}{hint}; the stages: {', '.join(STAGES)}"
        print(f"{prog}: error: {problem}\nsee {prog} --help for the stages", file=sys.stderr)
        return 2
    stage = STAGE_ALIASES.get(argv[0], argv[0])
    rest, plan = split_plan_flags(argv[1:]) if stage == "ppo" else (argv[1:], None)
    cfg = parse_config(_stage_config(stage), rest, description=f"preflight of stage {stage}")
    problems = preflight(stage, cfg)
    if plan is not None and not problems:
        problems = print_plan(cfg, plan)
    for p in problems:
        print(f"preflight: {p}", file=sys.stderr)
    if problems:
        print(
            f"preflight: {len(problems)} problem(s) with the models or data of stage {stage}; "
            "nothing was launched",
            file=sys.stderr,
        )
        return 2
    print(f"preflight: stage {stage}: models and data in place", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
