"""The shipped pretrained tiny model (`--model_name_or_path tiny-base`) and its recipe."""

import json
import sys
from pathlib import Path

import pytest
import torch

from marlhf.data.synthetic import gold_score, pretraining_rows, prompt_of
from marlhf.models import zoo
from marlhf.models.load import resolve_model_path
from marlhf.pipeline import recipes
from tests.support.forked import run_python
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


def _valid_prompts(n: int) -> list[str]:
    with open(zoo.bundled_corpus_path()) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [prompt_of(r) for r in rows if r["split"] != "train"][:n]


def _greedy(model_dir: str, prompts: list[str]) -> tuple[list[str], float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id
        )
    resp = out[:, enc["input_ids"].shape[1] :]
    ended = (resp == tok.eos_token_id).any(1).float().mean().item()
    return tok.batch_decode(resp, skip_special_tokens=True), ended


def test_tiny_base_resolves_to_the_shipped_files():
    path = Path(resolve_model_path("tiny-base"))
    assert path == zoo.BASE_DIR
    for name in zoo.BASE_FILES:
        assert (path / name).is_file(), name
    record = json.loads((path / "pretraining.json").read_text())
    assert record["sft_flags"] == list(recipes.PRETRAIN_FLAGS)
    assert (
        record["corpus"]
        == f"marlhf.data.synthetic.pretraining_rows({recipes.PRETRAIN_ROWS}, seed=0)"
    )
    cfg = json.loads((path / "config.json").read_text())
    for key, value in zoo.TINY_SHAPE.items():
        assert cfg[key] == value, key
    assert cfg["dtype"] == "float32"  # loads in fp32 like the stages expect, not bf16


def test_tiny_base_tokenizer_is_the_tiny_tokenizer(tmp_path):
    """The base was pretrained from `tiny`: its tokenizer must be the one `tiny` builds."""
    from transformers import AutoTokenizer

    built = AutoTokenizer.from_pretrained(zoo.build_tiny(tmp_path / "tiny"))
    shipped = AutoTokenizer.from_pretrained(zoo.BASE_DIR)
    assert built.get_vocab() == shipped.get_vocab()
    text = "POST\nSubreddit: r/pets\nMy dog chewed the couch.\nTL;DR: "
    assert built(text)["input_ids"] == shipped(text)["input_ids"]


def test_tiny_base_summarises_and_stops_where_random_tiny_cannot(tmp_path):
    """Graded by the gold scorer (independent of the model): measured 2026-11-23 on these 32
    prompts, greedy: tiny-base gold 0.33 with every response ending in EOS; random tiny -1.0 (it
    writes only spaces and never stops)."""
    prompts = _valid_prompts(32)
    texts, ended = _greedy(resolve_model_path("tiny-base"), prompts)
    base_gold = sum(gold_score(p, t) for p, t in zip(prompts, texts, strict=True)) / len(prompts)
    rand_texts, _ = _greedy(str(zoo.build_tiny(tmp_path / "random")), prompts)
    rand_gold = sum(gold_score(p, t) for p, t in zip(prompts, rand_texts, strict=True)) / len(
        prompts
    )
    assert ended >= 0.9
    assert base_gold > 0.0
    assert rand_gold < -0.8
    assert base_gold - rand_gold > 1.0


def test_missing_base_names_the_rebuild_command(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "BASE_DIR", tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="python -m marlhf.tiny --pretrain"):
        resolve_model_path("tiny-base")


def test_pretraining_rows_are_deterministic_correct_and_apart_from_the_bundle():
    rows = pretraining_rows(50)
    assert rows == pretraining_rows(50)
    assert rows != pretraining_rows(50, seed=1)
    assert all(
        gold_score(r["prompt"], r["chosen"]) > 0.85 for r in rows
    )  # every fact, no invention
    with open(zoo.bundled_corpus_path()) as f:
        bundled = {json.loads(line)["info"]["post"] for line in f if line.strip()}
    posts = {r["prompt"].split("\n")[2] for r in rows}
    assert not posts & bundled


@pytest.mark.slow
def test_pretrain_recipe_runs_and_writes_a_loadable_base(tmp_path):
    env = stage_env(tmp_path / "home")
    out = tmp_path / "base"
    cmd = [sys.executable, "-m", "marlhf.tiny", "--pretrain", str(out), "--rows", "64"]
    cmd += ["--max_steps", "2", "--per_device_train_batch_size", "4", "--disable_progress_bar"]
    proc = run_python(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in (*zoo.BASE_FILES, "pretraining.json"):
        assert (out / name).is_file(), name
    record = json.loads((out / "pretraining.json").read_text())
    assert record["steps"] == 2 and record["sft_flags"][-5:] == [
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--disable_progress_bar"
    ]  # fmt: skip
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == zoo.TINY_SHAPE["num_hidden_layers"]
