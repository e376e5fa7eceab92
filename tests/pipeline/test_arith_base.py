"""The shipped base of the arithmetic tasks (``--model_name_or_path tiny-base-arith``) and its recipe.

Graded on held-out problems by the task's gold scorer (``marlhf.data.reasoning_tasks``), which knows
nothing of the model.
"""

import json
from pathlib import Path

import pytest
import torch

from marlhf.data.reasoning_tasks import (
    N_TRAIN,
    PRETRAIN_FIRST_FLIP,
    PRETRAIN_SLIP,
    arith_gold,
    final_answer,
    generate,
)
from marlhf.models import zoo
from marlhf.models.load import resolve_model_path
from marlhf.pipeline import recipes
from marlhf.pipeline.figures import generate_answers


def _effective(flags) -> dict:
    """``--flag value`` pairs (a bare flag: True) with later flags winning, as argparse reads them."""
    out, flags = {}, list(flags)
    for i, f in enumerate(flags):
        if f.startswith("--"):
            nxt = flags[i + 1] if i + 1 < len(flags) else None
            out[f] = True if nxt is None or nxt.startswith("--") else nxt
    return out


def test_arith_base_resolves_to_the_shipped_files():
    from safetensors import safe_open
    from transformers import AutoTokenizer

    path = Path(resolve_model_path("tiny-base-arith"))
    assert path == zoo.ARITH_BASE_DIR
    for name in (*zoo.BASE_FILES, "pretraining.json"):
        assert (path / name).is_file(), name
    cfg = json.loads((path / "config.json").read_text())
    for key, value in zoo.TINY_SHAPE.items():
        want = recipes.HORIZON_MAX_POSITIONS if key == "max_position_embeddings" else value
        assert cfg[key] == want, key
    assert cfg["dtype"] == "float32"
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["max_new_tokens"] == zoo.ARITH_NEW_TOKENS
    with safe_open(path / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    record = json.loads((path / "pretraining.json").read_text())
    assert record["recipe"] == "python -m marlhf.tiny --pretrain OUT_DIR --arith"
    ran = _effective(record["sft_flags"])
    for flag in ("--disable_progress_bar", "--save_steps"):  # neither changes the weights
        ran.pop(flag, None)
    assert ran == _effective(recipes.ARITH_FLAGS)
    assert record["corpus"] == (
        f"marlhf.data.reasoning_tasks.pretraining_rows({recipes.ARITH_ROWS}, seed=0, "
        f"slip={PRETRAIN_SLIP}, first_flip={PRETRAIN_FIRST_FLIP})"
    )
    shipped = AutoTokenizer.from_pretrained(path)
    assert shipped.get_vocab() == AutoTokenizer.from_pretrained(zoo.BASE_DIR).get_vocab()


def test_missing_arith_base_names_the_rebuild_command(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "ARITH_BASE_DIR", tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match=r"python -m marlhf.tiny --pretrain .* --arith"):
        resolve_model_path("tiny-base-arith")


def test_base_writes_solutions_in_the_format_and_is_right_part_of_the_time():
    """The 64 held-out 4-step problems of the recorded figures (``pretraining.json``) at temperature
    1: solutions with an answer line, right only part of the time (16 problems are too few: at an
    accuracy near 0.2 one draw in four would get at most one right)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path("tiny-base-arith")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert next(model.parameters()).dtype == torch.float32  # bf16 on disk, fp32 in use
    prompts = [r["prompt"] for r in generate("synthetic-arith-4", 64, 0, "valid", N_TRAIN)]
    torch.manual_seed(0)
    answers, lengths, ended = generate_answers(model, tok, prompts, 112, 1.0)
    golds = [arith_gold(p, a) for p, a in zip(prompts, answers, strict=True)]
    assert ended == len(prompts)
    assert sum(final_answer(a) is not None for a in answers) >= 56, answers
    assert 0.1 <= sum(golds) / len(golds) <= 0.9, answers
    assert 55 <= sum(lengths) / len(lengths) <= 85


@pytest.mark.slow
def test_arith_recipe_runs_and_writes_a_loadable_base(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    out = tmp_path / "base"
    flags = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--disable_progress_bar"]
    recipes.pretrain_base(out, 64, flags, tmp_path / "work", arith=True, figure_prompts=2)
    record = json.loads((out / "pretraining.json").read_text())
    assert record["steps"] == 2 and record["recipe"].endswith("--arith")
    assert record["corpus"].startswith("marlhf.data.reasoning_tasks.pretraining_rows(64, seed=0")
    assert set(record["figures"]) == {
        "prompts_per_task",
        *(f"synthetic-arith-{k}/{m}" for k in (4, 8, 16) for m in ("greedy", "T1")),
    }
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.max_position_embeddings == recipes.HORIZON_MAX_POSITIONS
    with pytest.raises(ValueError, match="--horizon and --arith"):
        recipes.pretrain_base(out, 4, (), horizon=16, arith=True)


def test_infer_scores_the_base_on_the_arithmetic_task_by_its_gold(tmp_path, monkeypatch):
    """``marlhf infer --dataset synthetic-arith-4 --model tiny-base-arith``: the data path and the
    base by name, each answer scored by the task's gold scorer (no reward model)."""
    from marlhf.commands import main as marlhf
    from marlhf.inference.results import read_rows

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    argv = ["infer", "--dataset", "synthetic-arith-4", "--model", "tiny-base-arith",
            "--num_samples", "4", "--max_prompt_len", "80", "--max_new_tokens", "96",
            "--temperature", "1.0", "--top_k", "0", "--proj-path", str(tmp_path),
            "--disable_progress_bar"]  # fmt: skip
    assert marlhf(argv) == 0
    (path,) = (tmp_path / "results").rglob("*.jsonl")
    rows = read_rows(str(path))
    assert len(rows) == 4
    for r in rows:
        assert r["prompt"].startswith("Task:\nA") and "Solution: start is " in r["prompt"]
        assert r["gold"] == arith_gold(r["prompt"], r["response"])
