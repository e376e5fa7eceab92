"""The shipped base of the trail task (``--model_name_or_path tiny-base-trail``): its files and
recipe, its tokenizer's chat template, the recipe's corpus as the SFT stage tokenises it, and the
base playing held-out games on the environments, graded by the task's gold (which knows nothing of
the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from marlhf.data import trail
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env
from marlhf.envs.runner import run_episodes
from marlhf.models import zoo
from marlhf.models.conversation import ChatLayout
from marlhf.models.load import resolve_model_path
from marlhf.pipeline import recipes
from marlhf.pipeline.figures import chat_act
from tests.support.forked import run_python


def test_the_base_resolves_to_the_shipped_files():
    from safetensors import safe_open
    from transformers import AutoTokenizer

    path = Path(resolve_model_path("tiny-base-trail"))
    assert path == zoo.TRAIL_BASE_DIR
    for name in (*zoo.TRAIL_BASE_FILES, "pretraining.json"):
        assert (path / name).is_file(), name
    cfg = json.loads((path / "config.json").read_text())
    assert all(cfg[k] == v for k, v in zoo.TINY_SHAPE.items()) and cfg["dtype"] == "float32"
    with safe_open(path / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["max_new_tokens"] == zoo.TRAIL_NEW_TOKENS
    record = json.loads((path / "pretraining.json").read_text())
    assert record["recipe"] == "python -m marlhf.tiny --pretrain OUT_DIR --trail"
    assert record["corpus"] == (
        f"marlhf.data.trail.pretraining_conversations({recipes.TRAIL_ROWS}, seed=0)"
    )
    assert record["task_version"] == trail.TRAIL_VERSION
    ran = [f for f in record["sft_flags"] if f != "--disable_progress_bar"]
    assert ran == list(recipes.TRAIL_FLAGS)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template == trail.CHAT_TEMPLATE
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(zoo.BASE_DIR).get_vocab()


def test_a_missing_base_names_the_rebuild_command(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "TRAIL_BASE_DIR", tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match=r"python -m marlhf.tiny --pretrain .* --trail"):
        zoo.ensure_trail_base()


def test_the_corpus_is_the_conversation_as_the_sft_stage_tokenises_it():
    """``[bos] + prompt + chosen + [eos]``, each tokenised apart as the SFT stage does, is the
    whole game rendered at once by the template (without the newline after the last <eos>)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-base-trail"))
    games = trail.pretraining_conversations(12, seed=0)
    for game, row in zip(games, recipes.trail_corpus(tok, 12), strict=True):
        enc = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
        staged = [tok.bos_token_id, *enc(row["prompt"]), *enc(row["chosen"]), tok.eos_token_id]
        whole = enc(tok.apply_chat_template(game, tokenize=False))
        assert staged == whole[:-1] and tok.decode(whole[-1:]) == "\n"
        # and the layout, turn by turn with each action's tokens, gives the same
        prompt, actions, obs = game[:1], [], []
        for m in game[1:]:
            if m["role"] == "assistant":
                actions.append((m["content"], enc(m["content"]) + [tok.eos_token_id]))
                obs.append([])
            else:
                obs[-1].append(m)
        assert ChatLayout(tok).build(prompt, actions, obs).token_ids == staged


@pytest.mark.parametrize("turns", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_the_base_plays_the_game_with_room_to_improve(turns):
    """Greedy it follows the format and the trails and mostly calls the right person first;
    sampled, its first call is right only part of the time. Measured on these 24 games (gold,
    first call right): greedy 0.75, 0.75 (2 turns), 0.88, 0.88 (4), 0.83, 0.83 (8); sampled 0.54,
    0.54; 0.62, 0.62; 0.62, 0.58 (a wrong first call can still win by calling the holder by luck)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path("tiny-base-trail")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert next(model.parameters()).dtype == torch.float32  # bf16 on disk, fp32 in use
    rows = trail.rows(turns, 24, seed=0, split="valid")
    worlds = [trail.World.from_info(r["extra_info"]) for r in rows]
    factory = load_env(f"marlhf-trail-{turns}")
    cfg = EnvConfig(env=factory.spec, max_turns=turns, env_timeout_s=0)
    out = {}
    for mode, temperature in (("greedy", 0.0), ("T1", 1.0)):
        torch.manual_seed(0)
        episodes = run_episodes(
            factory, rows, chat_act(model, tok, temperature, zoo.TRAIL_NEW_TOKENS), cfg
        )
        golds = [trail.gold(w, e.messages) for w, e in zip(worlds, episodes, strict=True)]
        firsts = [
            trail.first_call(e.messages) == w.key for w, e in zip(worlds, episodes, strict=True)
        ]
        assert all(e.stop == "done" for e in episodes)  # the game ends by its last turn
        if mode == "greedy":  # it calls and follows until the last turn, then answers
            assert all(len(e.turns) == turns for e in episodes)
        out[mode] = (sum(golds) / len(golds), sum(firsts) / len(firsts))
    assert out["greedy"][0] >= 0.5, out
    assert 0.3 <= out["T1"][1] <= 0.95, out  # an early decision left to learn


@pytest.mark.slow
def test_the_recipe_runs_and_writes_a_loadable_base(tmp_path):
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.stage_env import stage_env

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "base"
    cmd = [sys.executable, "-m", "marlhf.tiny", str(out), "--pretrain", "--trail", "--rows", "60"]
    cmd += ["--max_steps", "2", "--per_device_train_batch_size", "4", "--disable_progress_bar"]
    env = stage_env(tmp_path / "home")
    proc = run_python(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "pretraining.json").read_text())
    assert record["steps"] == 2
    assert record["corpus"] == "marlhf.data.trail.pretraining_conversations(60, seed=0)"
    assert set(record["figures"]) == {
        "prompts_per_task",
        *(f"marlhf-trail-{t}/{m}" for t in trail.TURNS for m in ("greedy", "T1")),
    }
    assert AutoTokenizer.from_pretrained(out).chat_template == trail.CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.float32
