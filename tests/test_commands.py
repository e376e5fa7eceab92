"""The ``marlhf`` command and the conventions every program's flags share (marlhf/commands.py,
marlhf/cli.py): subcommands, one name per thing across tools, dashes or underscores, "did you
mean", two-line errors, --help grouped by part, --config files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from marlhf.cli import GROUP_ORDER, build_parser, parse_config
from marlhf.commands import COMMANDS
from marlhf.commands import main as marlhf
from marlhf.inference import InferenceArgs
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.sft.config import SFTConfig


def test_lists_the_commands_and_suggests_one(capsys):
    assert marlhf([]) == 2
    out = capsys.readouterr().out
    for name in ("sft", "rm", "ppo", "infer", "judge", "human-eval", "sample", "compare", "view",
                 "demo", "preflight"):  # fmt: skip
        assert re.search(rf"^  {re.escape(name)} ", out, re.M), name
    assert marlhf(["sfft"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["marlhf: error: unknown command sfft (did you mean sft?)",
                   "see marlhf --help for the commands"]  # fmt: skip


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        marlhf([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: marlhf {name}") and "--config FILE" in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_opens_with_what_the_program_does(name, capsys):
    """The text under the usage line is for users: what the program does, not how its flags are
    generated; the judge's names its main flags."""
    with pytest.raises(SystemExit):
        marlhf([name, "--help"])
    out = capsys.readouterr().out
    opening = out.split("\n\n")[1]  # the paragraph after the usage line
    for developer in ("generator", "one part", "dataclass"):
        assert developer not in opening.lower(), (name, opening)
    if name == "judge":
        text = " ".join(opening.split())
        assert text.startswith("Compare two models by their answers to the same prompts")
        for flag in ("--model_name_a", "--model_name_b", "--dataset", "--judge_model", "--dry_run"):
            assert flag in text, flag


HEAVY = ("torch", "transformers", "deepspeed", "datasets")
# the commands whose --help and flag errors must come without the heavy packages
LIGHT = ("sft", "rm", "ppo", "infer", "judge", "human-eval", "sample")
_PROBE = (
    "import json, sys\n"
    "from marlhf.commands import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        *([name, "--help"] for name in LIGHT),
        ["ppo", "--ngram", "x"],
        ["sft", "--learning_rate", "fast"],
        ["infer", "--temperature", "hot"],
    ],
    ids=" ".join,
)
def test_help_and_flag_errors_import_no_torch(argv):
    """``marlhf``, ``marlhf SUB --help`` and a bad flag answer before torch (and transformers,
    DeepSpeed, datasets) is imported: seconds on a CPU that the answer does not need."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    code, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy == []
    if argv[-1] == "--help":
        assert code == 0 and "usage: marlhf" in proc.stdout
    else:
        assert code == 2 and f"error: argument --{argv[1][2:]}" in proc.stderr, proc.stderr


def test_console_script_and_original_paths():
    # `python -m marlhf`, as the console script runs it, and a script path of the original
    for cmd in ([sys.executable, "-m", "marlhf", "view", "--help"],
                [sys.executable, "inference/inference_with_rewards.py", "--help"]):  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "--config FILE" in proc.stdout


def test_dashes_and_underscores_are_one_flag():
    a = parse_config(SFTConfig, ["--learning-rate", "0.25", "--per-device-train-batch-size=3"])
    b = parse_config(SFTConfig, ["--learning_rate", "0.25", "--per_device_train_batch_size", "3"])
    assert a == b and a.optim.learning_rate == 0.25 and a.optim.per_device_train_batch_size == 3


def test_same_names_across_tools():
    inf = parse_config(InferenceArgs, ["--model_name_or_path", "m", "--max_answer_seq_len", "7",
                                       "--max_prompt_seq_len", "9"])  # fmt: skip
    s = inf.inference.sampling
    assert (inf.inference.model, s.max_answer_seq_len, s.max_prompt_seq_len) == ("m", 7, 9)
    old = parse_config(InferenceArgs, ["--model", "m", "--max-new-tokens", "7"])
    assert old == parse_config(
        InferenceArgs, ["--model_name_or_path", "m", "--max_answer_seq_len", "7"]
    )
    ppo = parse_config(PPOStageConfig, ["--max_new_tokens", "7", "--max_prompt_len", "9"])
    assert (ppo.generation.max_answer_seq_len, ppo.generation.max_prompt_seq_len) == (7, 9)
    # the original inference script's spellings of the sampling flags, shared with PPO
    orig = ["--max-new-tokens", "5", "--max-prompt-len", "11", "--top-k", "3", "--top-p", "0.5"]
    got = parse_config(InferenceArgs, orig).inference.sampling
    assert (got.max_answer_seq_len, got.max_prompt_seq_len, got.top_k, got.top_p) == (5, 11, 3, 0.5)


def test_unknown_flag_is_two_lines_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(PPOStageConfig, ["--max_promt_seq_len", "5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert "unknown flag --max_promt_seq_len (did you mean --max_prompt_seq_len?)" in err[0]
    with pytest.raises(SystemExit):
        parse_config(PPOStageConfig, ["--ngram", "five"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--ngram" in err[0] and "five" in err[0]


def test_help_is_grouped_by_part_in_order_with_choices():
    text = build_parser(PPOStageConfig).format_help()
    titles = re.findall(r"^([a-z][a-z ]+):$", text, re.M)
    known = [t for t in titles if t in GROUP_ORDER]
    assert known == [t for t in GROUP_ORDER if t in titles]  # in the documented order
    assert {"model", "data", "generation", "algorithm", "macro actions", "logging",
            "performance"} <= set(titles)  # fmt: skip
    assert "{fixed,randomized,parsing,ppl,entropy,lowprob,step,turn}" in text
    inf = build_parser(InferenceArgs).format_help()
    gen = inf.split("\ngeneration:\n")[1].split("\n\n")[0]
    assert "--temperature" in gen and "--top_k" in gen


# --------------------------------------------------------------------------------------------------
# --config FILE


def test_config_json_nested_and_yaml_flat_with_command_line_winning(tmp_path):
    nested = tmp_path / "run.json"
    nested.write_text(json.dumps({"optim": {"learning_rate": 0.5, "seed": 7},
                                  "data": {"data_path": ["a.jsonl", "b.jsonl"]},
                                  "log": {"enable_tensorboard": False}}))  # fmt: skip
    cfg = parse_config(SFTConfig, ["--config", str(nested), "--seed", "9"])
    assert (cfg.optim.learning_rate, cfg.optim.seed) == (0.5, 9)
    assert cfg.data.data_path == ("a.jsonl", "b.jsonl") and cfg.log.enable_tensorboard is False
    pytest.importorskip("yaml")
    flat = tmp_path / "run.yaml"
    flat.write_text("learning-rate: 0.125\nmax_steps: 3\ndisable_progress_bar: true\n")
    cfg = parse_config(SFTConfig, [f"--config={flat}"])
    assert (cfg.optim.learning_rate, cfg.optim.max_steps, cfg.log.disable_progress_bar) == (
        0.125, 3, True,
    )  # fmt: skip


def test_config_unknown_key_and_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"lerning_rate": 1}))
    with pytest.raises(SystemExit):
        parse_config(SFTConfig, ["--config", str(bad)])
    err = capsys.readouterr().err
    assert "lerning_rate is no flag of this program (did you mean --learning_rate?)" in err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SystemExit):
        parse_config(SFTConfig, ["--config", str(broken)])
    assert "not valid JSON" in capsys.readouterr().err


def test_a_saved_run_config_round_trips(tmp_path):
    """run_config.json (config_to_dict of a config) given as --config gives the same config."""
    from marlhf.cli import config_to_dict

    cfg = parse_config(PPOStageConfig, ["--ngram", "5", "--advantage_estimator", "gae",
                                        "--report_to", "none", "--target_macro_len", "3"])  # fmt: skip
    path = tmp_path / "run_config.json"
    path.write_text(json.dumps(config_to_dict(cfg)))
    assert parse_config(PPOStageConfig, ["--config", str(path)]) == cfg
