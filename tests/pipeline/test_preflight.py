"""Tests for ``python -m marlhf.preflight`` (marlhf.pipeline.preflight) and the model checks:
missing models and data are named before anything is loaded, reward-model directories are only
accepted where a reward model belongs, and the models of a PPO run must share one tokenizer (checked
by the preflight command and by the PPO stage itself)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marlhf.cli import parse_config
from marlhf.models.checks import check_same_tokenizer, tokenizer_differences, tokenizer_signature
from marlhf.models.sources import model_source_problem
from marlhf.models.zoo import build_tiny, train_tokenizer
from marlhf.pipeline.preflight import main

ROOT = Path(__file__).resolve().parents[2]
POSTS = [
    "POST\nSubreddit: r/cats\nMy cat Tom is ten years old and gained weight.\nTL;DR: ",
    "my cat gained weight and I need diet advice",
    "POST\nSubreddit: r/dogs\nOur dog Rex barks at night when the neighbours come home.\nTL;DR: ",
    "dog barks at night",
] * 20
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
] * 20


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """An SFT model, a reward model trained from it, and a reward model on another tokenizer (the
    "Llama actor, GPT-2 reward model" mistake) with a smaller embedding."""
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, save_reward_model

    base = tmp_path_factory.mktemp("preflight")
    sft = build_tiny(base / "sft", POSTS + CODE)
    other = build_tiny(base / "other", CODE)
    for src, dst in ((sft, "rm"), (other, "rm_other")):
        rm = RewardModel.from_pretrained(src)
        save_reward_model(rm, AutoTokenizer.from_pretrained(src), base / dst)
    return base


def _err(capsys) -> str:
    return capsys.readouterr().err


# --- models that are not there --------------------------------------------------------------------
def test_offline_hub_model_not_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["sft", "--model_name_or_path", "google/gemma-2b"]
    argv += ["--data_path", "openai/summarize_from_feedback"]
    assert main(argv) == 2
    err = _err(capsys)
    (line,) = [x for x in err.splitlines() if "google/gemma-2b" in x]
    assert "--model_name_or_path google/gemma-2b" in line and "not in the local cache" in line
    assert "HF_HUB_OFFLINE=1" in line and "nothing was launched" in err


def test_unreachable_hub_not_cached(tmp_path, monkeypatch):
    import marlhf.models.sources as pf

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(pf, "hub_reachable", lambda timeout_s=5.0: False)
    p = model_source_problem("google/gemma-2b", "--model_name_or_path")
    assert "cannot be reached" in p and "google/gemma-2b" in p
    # with the network up it is left to the download
    monkeypatch.setattr(pf, "hub_reachable", lambda timeout_s=5.0: True)
    assert model_source_problem("google/gemma-2b", "--model_name_or_path") is None


def test_missing_local_paths_do_not_exist(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["ppo", "--actor_model_name_or_path", "out/sft"]
    argv += ["--critic_model_name_or_path", "./out/rm", "--data_path", "data/train.jsonl"]
    assert main(argv) == 2
    lines = [x for x in _err(capsys).splitlines() if "does not exist" in x]
    assert len(lines) == 3
    assert lines[0].startswith("preflight: --actor_model_name_or_path out/sft:")
    assert str(tmp_path / "out" / "sft") in lines[0]
    assert "--critic_model_name_or_path ./out/rm" in lines[1]
    assert str(tmp_path / "data" / "train.jsonl") in lines[2]


def test_local_looking_names():
    from marlhf.models.sources import looks_local

    for name in ("/abs/model", "./m", "../m", "~/m", "a/b/c", "out/", "m o"):
        assert looks_local(name), name
    for name in ("google/gemma-2b", "gpt2", "openai-community/gpt2"):
        assert not looks_local(name), name


def test_unknown_dataset_is_named(capsys):
    assert main(["sft", "--model_name_or_path", "tiny", "--data_path", "no-such-set"]) == 2
    err = _err(capsys)
    assert "no-such-set" in err and "known:" in err


def test_all_in_place(models, capsys):
    base = models
    argv = ["ppo", "--actor_model_name_or_path", str(base / "sft")]
    argv += ["--critic_model_name_or_path", str(base / "rm"), "--data_path", "synthetic-tldr"]
    assert main(argv) == 0
    assert "in place" in _err(capsys)
    assert main(["sft", "--model_name_or_path", "tiny-base", "--data_path", "synthetic-tldr"]) == 0


def test_stages_are_named_as_the_marlhf_commands_name_them(capsys):
    """``rm`` (as ``marlhf rm``), ``reward`` its other name; a missing or unknown stage is an
    ``error:`` line with "did you mean" and where the stages are listed."""
    import marlhf.cli
    from marlhf.commands import COMMANDS

    assert {"sft", "rm", "ppo"} <= set(COMMANDS)
    for stage in ("rm", "reward"):
        assert (
            main([stage, "--model_name_or_path", "tiny-base", "--data_path", "synthetic-tldr"]) == 0
        )
        assert "preflight: stage rm: models and data in place" in _err(capsys)
    prog = marlhf.cli.PROG or "python -m marlhf.preflight"
    for argv, problem in (
        (["rmm"], "unknown stage rmm (did you mean rm?); the stages: sft, rm, ppo, infer"),
        (["rewards"], "unknown stage rewards (did you mean rm?); the stages: sft, rm, ppo, infer"),
        ([], "name the stage to check first: sft, rm, ppo, infer"),
        (["--model_name_or_path", "tiny"], "name the stage to check first: sft, rm, ppo, infer"),
    ):
        assert main(argv) == 2
        assert _err(capsys).splitlines() == [
            f"{prog}: error: {problem}",
            f"see {prog} --help for the stages",
        ]


# --- the wrong kind of directory ------------------------------------------------------------------
def test_reward_model_as_actor_and_sft_as_critic(models, capsys):
    base = models
    argv = ["ppo", "--actor_model_name_or_path", str(base / "rm")]
    argv += ["--critic_model_name_or_path", str(base / "sft"), "--data_path", "synthetic-tldr"]
    assert main(argv) == 2
    err = _err(capsys)
    assert f"--actor_model_name_or_path {base / 'rm'}: this is a reward-model directory" in err
    assert f"--critic_model_name_or_path {base / 'sft'}: not a reward-model directory" in err
    assert main(["sft", "--model_name_or_path", str(base / "rm")]) == 2
    assert "--model_name_or_path" in _err(capsys)


# --- one tokenizer for actor, reference, critic and reward model ---------------------------------
def test_tokenizer_differences_name_what_differs():
    a = train_tokenizer(POSTS, vocab_size=300)
    assert tokenizer_differences(a, train_tokenizer(POSTS, vocab_size=300)) == []
    b = train_tokenizer(CODE, vocab_size=300)
    diff = " ".join(tokenizer_differences(a, b))
    assert "vocabulary size" in diff or "vocabulary hash" in diff
    assert "tokens missing or with another id" in diff
    # the same vocabulary with another eos: only the eos differs
    c = train_tokenizer(POSTS, vocab_size=300)
    c.eos_token = c.unk_token
    assert tokenizer_differences(a, c) == [f"eos id {a.eos_token_id} vs {c.unk_token_id}"]
    sig = tokenizer_signature(a, "x")
    assert sig.size == len(a) and dict(sig.special)["bos"] == a.bos_token_id and sig.adds_bos


def test_check_same_tokenizer_names_both_models(models):
    base = models
    sft, rm, other = str(base / "sft"), str(base / "rm"), str(base / "rm_other")
    check_same_tokenizer({"--actor_model_name_or_path": sft, "--critic_model_name_or_path": rm})
    with pytest.raises(ValueError) as e:
        check_same_tokenizer(
            {"--actor_model_name_or_path": sft, "--critic_model_name_or_path": other}
        )
    msg = str(e.value)
    assert f"--actor_model_name_or_path {sft} and --critic_model_name_or_path {other}" in msg
    assert "different tokenizers" in msg and "vocabulary size" in msg
    assert "out of range" in msg  # the other embedding is smaller than the actor's vocabulary


def test_ppo_stage_refuses_mixed_tokenizers_before_loading(models, monkeypatch):
    """build_models checks the tokenizers before any weights are loaded (without the check:
    a silent mismatch or `index out of range in self` deep in the first forward)."""
    import marlhf.stages.ppo.models as ppo
    from marlhf.stages.ppo.config import PPOStageConfig

    base = models
    loaded = []
    monkeypatch.setattr(ppo, "load_causal_lm", lambda *a, **k: loaded.append(a) or 1 / 0)
    argv = ["--actor_model_name_or_path", str(base / "sft")]
    argv += ["--critic_model_name_or_path", str(base / "rm_other")]
    cfg = parse_config(PPOStageConfig, argv)
    with pytest.raises(ValueError, match="different tokenizers") as e:
        ppo.build_models(cfg, total_updates=1)
    assert str(base / "rm_other") in str(e.value) and loaded == []
    # the reward model as the reference: caught the same way
    argv2 = argv[:2] + ["--critic_model_name_or_path", str(base / "rm")]
    argv2 += ["--reference_model_name_or_path", str(base / "other")]
    with pytest.raises(ValueError, match="--reference_model_name_or_path"):
        ppo.build_models(parse_config(PPOStageConfig, argv2), total_updates=1)
    assert loaded == []


def test_ppo_stage_loads_the_actors_tokenizer_once(models, monkeypatch):
    """The stage's own tokenizer (the actor's) serves the check: only the critic's is loaded."""
    import marlhf.models.checks as checks
    import marlhf.stages.ppo.models as ppo
    from marlhf.models.load import load_tokenizer
    from marlhf.stages.ppo.config import PPOStageConfig

    base = models
    sft, rm = str(base / "sft"), str(base / "rm")
    cfg = parse_config(
        PPOStageConfig, ["--actor_model_name_or_path", sft, "--critic_model_name_or_path", rm]
    )
    actor_tok = load_tokenizer(ppo.model_config(cfg.models, cfg.models.actor), "left")
    paths = []
    monkeypatch.setattr(
        checks, "load_tokenizer", lambda m: paths.append(m.model_name_or_path) or load_tokenizer(m)
    )
    monkeypatch.setattr(ppo, "build_actor", lambda *a: 1 / 0)  # stop after the check
    with pytest.raises(ZeroDivisionError):
        ppo.build_models(cfg, 1, actor_tok)
    assert paths == [rm]


def test_command_line_is_fast_and_quiet(tmp_path):
    """One process, one line per problem, a few seconds: not a traceback from every rank."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "marlhf.preflight",
            "sft",
            "--model_name_or_path",
            "google/gemma-2b",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2
    assert time.monotonic() - t0 < 60
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "google/gemma-2b" in lines[0] and "Traceback" not in r.stderr


# --- rewards without a reward model ---------------------------------------------------------------
def test_a_run_on_its_own_reward_needs_no_reward_model_and_names_a_bad_task(capsys):
    argv = ["ppo", "--actor_model_name_or_path", "tiny-base", "--advantage_estimator", "grpo"]
    argv += ["--n_samples_per_prompt", "2"]
    assert main([*argv, "--data_path", "reasoning-gym:leg_counting"]) == 0  # auto: its scorer
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # auto is rm, and no reward model is given
        main([*argv, "--data_path", "synthetic-tldr"])
    assert e.value.code == 2 and "needs the reward model" in _err(capsys)
    assert main([*argv, "--data_path", "reasoning-gym:leg_countin"]) == 2
    assert "reasoning-gym has no task 'leg_countin'; did you mean leg_counting" in _err(capsys)
