"""``--data_path reasoning-gym:NAME``: reasoning-gym's tasks as examples of every program (marlhf.data.gym),
and a local file's other columns kept for the rewards (meta["columns"])."""

from __future__ import annotations

import json

import pytest

from marlhf.data.config import DataConfig
from marlhf.data.gym import gym_examples
from marlhf.data.schema import DataError
from marlhf.data.sources import load_examples
from marlhf.pipeline.preflight import data_problem


def test_a_task_becomes_prompts_answers_and_its_entries_independently_of_the_stage():
    import reasoning_gym

    exs, bad = load_examples("reasoning-gym:leg_counting:40", "train")
    assert bad == 0 and len(exs) == 40
    # the entries straight from reasoning-gym: train split seed 1
    ds = reasoning_gym.create_dataset("leg_counting", size=40, seed=1)
    entries = list(ds)
    for i, (ex, e) in enumerate(zip(exs, entries, strict=True)):
        assert ex.prompt == e["question"].rstrip() + "\nAnswer:"
        assert ex.chosen == f" {e['answer']}"
        assert ex.meta["columns"]["answer"] == e["answer"]
        assert ex.meta["reasoning_gym"] == {
            "task": "leg_counting",
            "seed": 1,
            "size": 40,
            "index": i,
        }
        assert ex.prompt_id == f"reasoning-gym/leg_counting/train/{i}"
        # the rejected answer is wrong for this entry, by the task's own scorer
        if ex.rejected is not None:
            assert ds.score_answer(ex.rejected.strip(), e) < 1.0
    assert sum(ex.rejected is not None for ex in exs) >= 35
    # the eval split: other entries (seed 2), a tenth of the size but at least 20
    ev, _ = load_examples("reasoning-gym:leg_counting:40", "eval")
    assert len(ev) == 20 and ev[0].prompt != exs[0].prompt
    # generated again: the same examples
    again, _ = load_examples("reasoning-gym:leg_counting:40", "train", max_samples=5)
    assert [e.prompt for e in again] == [e.prompt for e in exs[:5]]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("reasoning-gym:leg_countin", r"no task 'leg_countin'; did you mean leg_counting"),
        ("reasoning-gym:", "name a task"),
        ("reasoning-gym:leg_counting:ten", "must be a positive integer"),
    ],
)
def test_a_bad_task_is_named_in_preflight_and_when_loading(spec, match):
    assert data_problem(spec) is not None and data_problem(spec).startswith(f"--data_path {spec}")
    with pytest.raises(DataError, match=match):
        gym_examples(spec, "train")
    assert data_problem("reasoning-gym:basic_arithmetic") is None


def test_every_program_builds_its_data_from_a_task(tmp_path):
    from marlhf.config import ModelConfig
    from marlhf.data.tokenize import build_pair_dataset, build_prompt_dataset, build_sft_dataset
    from marlhf.models.load import load_tokenizer

    tok = load_tokenizer(ModelConfig(model_name_or_path="tiny-base"))
    cfg = DataConfig(
        data_path=("reasoning-gym:basic_arithmetic:30",),
        data_output_path=str(tmp_path / "cache"),
        data_split="1,1,1",
    )
    sft = build_sft_dataset(cfg, tok, "train", 0)
    pairs = build_pair_dataset(cfg, tok, "train", 0)
    prompts, _ = build_prompt_dataset(cfg, tok, "train", 0, max_prompt_len=128)
    assert len(sft) > 0 and len(pairs) > 0 and len(prompts) > 0
    assert len(sft) + len(pairs) + len(prompts) <= 30 + 2  # each phase its own rows
    meta = json.loads(prompts[0]["meta"])
    assert meta["reasoning_gym"]["task"] == "basic_arithmetic" and "answer" in meta["columns"]


def test_a_local_files_other_columns_reach_the_meta(tmp_path):
    rows = [
        {"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3, "chosen": "x"}
        for i in range(12)
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exs, _ = load_examples(str(path), "train")
    by_prompt = {r["prompt"]: r for r in rows}
    for ex in exs:
        row = by_prompt[ex.prompt]
        assert ex.meta["columns"] == {"answer": row["answer"], "level": row["level"]}
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
             "solution": "42"}]  # fmt: skip
    path = tmp_path / "chat" / "train.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(chat[0]) + "\n")
    (ex,), _ = load_examples(str(path.parent), "train")
    assert ex.meta["columns"] == {"solution": "42"}
