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
        from marlhf.stages.sft.config import SFTConfig

        return SFTConfig
    if stage == "reward":
        from marlhf.stages.reward.config import RewardStageConfig

        return RewardStageConfig
    if stage == "ppo":
        from marlhf.stages.ppo.config import PPOStageConfig

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
    """(stage, argv) of a script: its ``ARGS=( ... )`` array, passed to ``python -m
    marlhf.preflight STAGE`` and to the ``python -m`` / ``deepspeed --module`` command of stage
    STAGE; ``exec bash "$(dirname "$0")/other.sh" "$@" FLAGS`` wrappers are followed."""
    text = path.read_text()
    for line in text.replace("\\\n", " ").splitlines():
        m = re.match(r'\s*exec bash "\$\(dirname "\$0"\)/([\w.]+)" "\$@"(.*)', line)
        if m:
            stage, argv = script_flags(path.parent / m.group(1))
            return stage, argv + shlex.split(m.group(2))
    m = re.search(r"^ARGS=\($(.*?)^\)$", text, re.MULTILINE | re.DOTALL)
    assert m, f"{path}: no ARGS=( ... ) array"
    tokens = shlex.split(_arith(m.group(1)))
    assert tokens[-1] == "$@", f"{path}: the array must end with the caller's flags"
    stages = set(re.findall(r"marlhf\.stages\.(\w+) \"\$\{ARGS\[@\]\}\"", text))
    assert len(stages) == 1, f"{path}: one marlhf.stages command with the ARGS array"
    return stages.pop(), [_expand(t) for t in tokens[:-1]]


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
    from marlhf.data.sources import load_examples, parse_spec

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


# --- running the scripts: preflight before launching, and a log that is appended to ---------------
STEP1 = ROOT / "training/step1_supervised_finetuning/training_scripts"
STEP3 = ROOT / "training/step3_rlhf_finetuning/training_scripts"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_script_preflights_before_launching_and_appends_its_log(path):
    text = path.read_text()
    if "exec bash" in text:
        return  # a wrapper: the script it runs is checked
    stage, _ = script_flags(path)
    command = {"reward": "rm"}.get(stage, stage)  # preflight names a stage as `marlhf` does
    pre = text.index(f'python -m marlhf.preflight {command} "${{ARGS[@]}}"')
    launch = text.index(f'marlhf.stages.{stage} "${{ARGS[@]}}"')
    assert pre < launch
    assert 'tee "' not in text and text.count('tee -a "$LOG"') == 2


def _fake_bin(tmp_path: Path) -> tuple[dict, Path]:
    """PATH with a `deepspeed` that only records it was started, and `python` = this interpreter;
    the hub cache is empty and offline."""
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "launched"
    (bin_dir / "deepspeed").write_text(f'#!/bin/sh\necho launched "$@" > {marker}\n')
    (bin_dir / "deepspeed").chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    return env, marker


def _run(script: Path, args: list[str], env: dict, cwd: Path):
    import subprocess
    import time

    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", str(script), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return r, time.monotonic() - t0


def test_gemma_sft_offline_fails_once_naming_the_model_without_launching(tmp_path):
    """Offline with no cached google/gemma-2b: one line naming it and HF_HUB_OFFLINE, from one
    process, before deepspeed starts any rank (not 33-50 s and 805 lines from 8 ranks)."""
    env, marker = _fake_bin(tmp_path)
    r, wall = _run(STEP1 / "run_gemma.sh", [str(tmp_path / "out" / "sft")], env, tmp_path)
    assert r.returncode != 0 and not marker.exists()
    out = r.stdout + r.stderr
    named = [x for x in out.splitlines() if "google/gemma-2b" in x]
    assert named and "HF_HUB_OFFLINE=1" in named[0] and "not in the local cache" in named[0]
    assert "Traceback" not in out and len(out.splitlines()) <= 3
    assert wall < 60
    log = (tmp_path / "out" / "sft" / "training.log").read_text()
    assert "google/gemma-2b" in log


def test_ppo_with_missing_sft_and_rm_dirs_says_does_not_exist(tmp_path):
    env, marker = _fake_bin(tmp_path)
    args = ["out/ppo", "out/sft", "out/rm"]
    r, _ = _run(STEP3 / "run_gemma.sh", args, env, tmp_path)
    assert r.returncode != 0 and not marker.exists()
    out = r.stdout + r.stderr
    assert f"--actor_model_name_or_path out/sft: {tmp_path / 'out' / 'sft'} does not exist" in out
    assert f"--critic_model_name_or_path out/rm: the directory {tmp_path / 'out' / 'rm'}" in out
    assert "connect" not in out.lower()


def test_rerun_appends_to_the_log_with_a_header_per_run(tmp_path):
    """A second run of a script keeps the first run's log and marks where each run starts."""
    env, _ = _fake_bin(tmp_path)
    stage = tmp_path / "bin" / "python"
    stage.unlink()  # `python -m marlhf.stages.sft` only prints; the preflight is the real one
    import sys

    stage.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$2" = marlhf.preflight ]; then exec {sys.executable} "$@"; fi\n'
        'echo "stage ran: $*"\n'
    )
    stage.chmod(0o755)
    out = tmp_path / "run" / "sft"
    for extra in ("--seed", "1"), ("--seed", "2"):
        r, _ = _run(STEP1 / "run_tiny.sh", [str(out), *extra], env, tmp_path)
        assert r.returncode == 0, r.stderr
    log = (out / "training.log").read_text().splitlines()
    headers = [x for x in log if x.startswith("=== ")]
    assert len(headers) == 2
    assert all("run_tiny.sh" in h and str(out) in h for h in headers)
    assert headers[0].endswith("--seed 1 ") and headers[1].endswith("--seed 2 ")
    ran = [x for x in log if x.startswith("stage ran:")]
    assert len(ran) == 2 and ran[0].endswith("--seed 1") and ran[1].endswith("--seed 2")
    assert log.index(headers[0]) < log.index(ran[0]) < log.index(headers[1]) < log.index(ran[1])
    assert sum("models and data in place" in x for x in log) == 2


def _stage_only_prints(tmp_path: Path) -> dict:
    """_fake_bin's PATH, where `python -m marlhf.stages.X` only prints its flags (the preflight
    is the real one)."""
    import sys

    env, _ = _fake_bin(tmp_path)
    stage = tmp_path / "bin" / "python"
    stage.unlink()
    stage.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$2" = marlhf.preflight ]; then exec {sys.executable} "$@"; fi\n'
        'echo "stage ran: $*"\n'
    )
    stage.chmod(0o755)
    return env


def test_tiny_scripts_take_the_embedded_bases_and_no_reward_model_for_the_oracle(tmp_path):
    """Step 2's run_tiny.sh takes an embedded base (tiny-base-64) as its model; step 3's takes `-`
    for the reward-model directory, so the oracle reward runs from a base alone (the critic: its
    backbone with a fresh value head)."""
    env = _stage_only_prints(tmp_path)
    step2 = ROOT / "training/step2_reward_model_finetuning/training_scripts/run_tiny.sh"
    r, _ = _run(step2, ["tiny-base-64", str(tmp_path / "rm")], env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "models and data in place" in r.stdout and "--model_name_or_path tiny-base-64" in r.stdout
    )
    args = [str(tmp_path / "oracle"), "tiny-base-64", "-", "--reward_source", "gold"]
    args += ["--data_path", "synthetic-facts-64", "--max_prompt_seq_len", "256"]
    r, _ = _run(STEP3 / "run_tiny.sh", [*args, "--max_answer_seq_len", "112"], env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "models and data in place" in r.stdout
    (ran,) = [x for x in r.stdout.splitlines() if x.startswith("stage ran:")]
    assert "--critic_model_name_or_path  --data_path" in ran  # empty: the critic is the actor
