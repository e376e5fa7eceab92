"""The prompt rows of a multi-turn run (``marlhf.data.env_rows``): SkyRL's dataset format from
JSON lines, JSON and Parquet files, the trail task's games by name, errors naming the row."""

from __future__ import annotations

import doctest
import json

import pytest

import marlhf.data.env_rows as env_rows
from marlhf.data import trail
from marlhf.data.env_rows import env_rows_problem, episode_row, load_env_rows, trail_gold
from marlhf.data.schema import DataError


def test_doctests():
    assert doctest.testmod(env_rows).failed == 0


ROWS = [
    {"id": "q1", "prompt": [{"role": "user", "content": "2+2?"}], "env_class": "gsm8k",
     "reward_spec": {"method": "rule", "ground_truth": "4"}},
    {"prompt": "plain text", "extra_info": {"k": [1, 2]}},
]  # fmt: skip


def test_rows_from_files_keep_their_columns_and_get_an_id_and_a_text(tmp_path):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    as_json = tmp_path / "rows.json"
    as_json.write_text(json.dumps(ROWS))
    import datasets

    parquet = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([ROWS[0], {**ROWS[0], "id": "q2"}]).to_parquet(str(parquet))
    for path in (jsonl, as_json):
        rows = load_env_rows((str(path),))
        assert [r["prompt_id"] for r in rows] == ["q1", f"{path}:1"]
        assert [r["prompt_text"] for r in rows] == ["2+2?", "plain text"]
        assert episode_row(rows[0]) == ROWS[0] and episode_row(rows[1]) == ROWS[1]
    rows = load_env_rows((str(parquet),))
    assert [r["prompt_id"] for r in rows] == ["q1", "q2"]
    assert episode_row(rows[0]) == ROWS[0]  # Parquet's arrays are plain lists again
    assert len(load_env_rows((str(jsonl), str(jsonl)), max_samples=1)) == 2


def test_trail_games_by_name_and_their_gold():
    rows = load_env_rows(("marlhf-trail-4:5",))
    assert [episode_row(r) for r in rows] == trail.rows(4, 5, seed=0, split="train")
    assert len(load_env_rows(("marlhf-trail-8",))) == env_rows.TRAIL_ROWS
    world = trail.World.from_info(rows[0]["extra_info"])
    right = trail.play(world, world.key)
    assert trail_gold(rows[0], right) == 1.0
    assert (
        trail_gold(rows[0], right[:-1] + [{"role": "assistant", "content": " my dog has it"}])
        == 0.0
    )
    assert trail_gold({"prompt": "x"}, right) is None


@pytest.mark.parametrize(
    "spec, says",
    [
        ("marlhf-trail-5", r"the trail task has \(2, 4, 8\) turns"),
        ("marlhf-trail-2:0", "the number of games must be >= 1"),
        ("synthetic-tldr", "with --env, name prompt rows in SkyRL's format"),
        ("rows.csv", "with --env, name prompt rows"),
    ],
)
def test_a_bad_entry_is_named(spec, says):
    assert env_rows_problem(spec) is not None
    with pytest.raises(DataError, match=says):
        load_env_rows((spec,))


def test_a_row_without_a_prompt_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": [{"role": "user"}]}) + "\n")
    with pytest.raises(DataError, match=r'bad.jsonl line 2: field "prompt"\[0\] is no'):
        load_env_rows((str(path),))
    with pytest.raises(DataError, match="no such file"):
        load_env_rows((str(tmp_path / "none.jsonl"),))
