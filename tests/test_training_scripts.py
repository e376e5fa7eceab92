"""Every flag in the training scripts (training/step*/training_scripts/*.sh) is accepted by its stage's
CLI, and the APPS recipe reaches the APPS adapter."""

import re
import shlex
from pathlib import Path

import pytest

from marlhf.cli import parse_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(ROOT.glob("training/step*/training_scripts/*.sh"))
NUM_GPUS = 8  # the scripts' default


def _stage_config(stage: str):
    if stage == "sft":
        from marlhf.stages.sft import SFTConfig

        return SFTConfig
    if stage == "reward":
        from marlhf.stages.reward import RewardStageConfig

        return RewardStageConfig
    if stage == "ppo":
        from marlhf.stages.ppo import PPOStageConfig

        return PPOStageConfig
    raise AssertionError(f"unknown stage {stage}")


def _arith(line: str) -> str:
    """Shell arithmetic ``$((512 / (8 * NUM_GPUS)))`` computed with the default NUM_GPUS."""

    def value(m: re.Match) -> str:
        expr = m.group(1).replace("NUM_GPUS", str(NUM_GPUS))
        assert re.fullmatch(r"[\d\s+*/()-]+", expr), expr
        return str(eval(expr.replace("/", "//")))  # noqa: S307 - digits and operators only

    return re.sub(r"\$\(\((.*?)\)\)(?!\))", value, line)


def _expand(token: str) -> str:
    """``$VAR`` / ``${VAR}`` in a flag value become a placeholder path."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"/tmp/\1", token)


def script_flags(path: Path) -> tuple[str, list[str]]:
    """(stage, argv) of the ``python -m`` / ``deepspeed --module`` command in a script, following
    ``exec bash "$(dirname "$0")/other.sh" "$@" FLAGS`` wrappers."""
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        m = re.match(r'\s*exec bash "\$\(dirname "\$0"\)/([\w.]+)" "\$@"(.*)', line)
        if m:
            stage, argv = script_flags(path.parent / m.group(1))
            return stage, argv + shlex.split(m.group(2))
        if "marlhf.stages." in line:
            tokens = shlex.split(_arith(line.split("|")[0]))
            i = next(i for i, t in enumerate(tokens) if t.startswith("marlhf.stages."))
            stage = tokens[i][len("marlhf.stages.") :]
            rest = tokens[i + 1 :]
            rest = rest[: rest.index("$@")] if "$@" in rest else rest
            return stage, [_expand(t) for t in rest]
    raise AssertionError(f"{path}: no marlhf.stages command")


def test_scripts_found():
    names = {p.name for p in SCRIPTS}
    assert {"run_codegemma_apps.sh", "run_gemma.sh", "run_tiny.sh"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_script_flag_is_accepted(path, capsys):
    stage, argv = script_flags(path)
    assert argv and argv[0].startswith("--")
    try:
        parse_config(_stage_config(stage), argv)
    except SystemExit:
        pytest.fail(f"{path.name}: {capsys.readouterr().err}")


def test_codegemma_apps_recipe_reaches_the_apps_adapter(monkeypatch):
    from marlhf.data.adapters import load_examples, parse_spec

    stage, argv = script_flags(
        ROOT / "training/step3_rlhf_finetuning/training_scripts/run_codegemma_apps.sh"
    )
    assert stage == "ppo"
    cfg = parse_config(_stage_config(stage), argv)
    # the recipe the script's header states
    assert cfg.ppo.reward_source == "code" and cfg.code.code_reward_scheme == "ppocoder"
    assert (cfg.macro.termination_condition, cfg.macro.ngram) == ("fixed", 10)
    assert cfg.data.data_split == "2,0,8"
    assert (cfg.generation.max_prompt_seq_len, cfg.generation.max_answer_seq_len) == (600, 512)
    g = cfg.generation
    assert (g.per_device_generation_batch_size * g.generation_batches * NUM_GPUS) == 16
    assert (g.per_device_generation_batch_size * g.generation_batches) % (
        cfg.ppo.per_device_training_batch_size
    ) == 0
    # --data_path names the APPS adapter, read from the hub's JSON-lines files (the repository's
    # loading script is not run by `datasets` any more)
    (spec,) = cfg.data.data_path
    adapter, local = parse_spec(spec)
    assert local is None and adapter.name == "codeparrot/apps"
    calls = []

    def fake_load_dataset(path, *args, **kw):
        import datasets

        calls.append((path, args, kw))
        row = {
            "problem_id": 3,
            "question": "Print 1.",
            "solutions": '["print(1)"]',
            "input_output": '{"inputs": [""], "outputs": ["1"]}',
            "difficulty": "introductory",
            "url": "u",
            "starter_code": "",
        }
        return datasets.Dataset.from_list([row])

    import datasets

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    (ex,), _ = load_examples(spec, "train")
    assert calls == [
        ("json", (), {"data_files": "hf://datasets/codeparrot/apps/train.jsonl", "split": "train"})
    ]
    assert ex.prompt_id == "apps/3" and ex.meta["tests"] and ex.chosen == "print(1)"
    load_examples(spec, "eval")
    assert calls[-1][2]["data_files"] == "hf://datasets/codeparrot/apps/test.jsonl"
