"""A prompt column under another name (``query``, ``instruction``): preflight says so before any
rank starts, listing the known schemas and adapters, and ``--data_columns prompt=query`` maps it."""

from __future__ import annotations

import json

import pytest

from marlhf.data.adapters import known_schemas
from marlhf.data.config import DataConfig
from marlhf.data.schema import DataError
from marlhf.data.sources import load_examples
from marlhf.pipeline.preflight import main as preflight_main

ROWS = [
    {"query": f"Question {i}: what is {i} + 1?\nAnswer:", "response": f" {i + 1}", "worse": " 0"}
    for i in range(30)
]


@pytest.fixture
def query_file(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_unknown_columns_list_the_schemas_and_the_mapping_reads_them(query_file):
    with pytest.raises(DataError) as err:
        load_examples(str(query_file), "train")
    text = str(err.value)
    assert "no known dataset schema in its columns ['query', 'response', 'worse']" in text
    assert "prompt (+ chosen, rejected, margin): plain" in text
    assert "choice/info/summaries: openai/summarize_from_feedback" in text
    assert "--data_columns" in text and "'adapter:path'" in text
    mapping = DataConfig(data_columns=("prompt=query", "chosen=response", "rejected=worse"))
    exs, _ = load_examples(str(query_file), "train", columns=mapping.column_mapping())
    assert len(exs) == 28  # the 95/5 carve of 30 rows
    by_prompt = {r["query"]: r for r in ROWS}
    for ex in exs:
        row = by_prompt[ex.prompt]
        assert (ex.chosen, ex.rejected) == (row["response"], row["worse"])


def test_mapping_flag_is_validated():
    for bad in (("prompt",), ("=query",), ("prompt=",), ("prompt=a", "prompt=b")):
        with pytest.raises(ValueError, match="--data_columns"):
            DataConfig(data_columns=bad)
    assert DataConfig(data_columns=("prompt=query",)).column_mapping() == {"query": "prompt"}


def test_no_mapping_keeps_the_data_cache_key():
    from marlhf.config import ModelConfig
    from marlhf.data.tokenize import cache_key
    from marlhf.models.load import load_tokenizer

    tok = load_tokenizer(ModelConfig(model_name_or_path="tiny-base"))
    key = cache_key(DataConfig(), tok, "train", 1, 1)
    assert "data_columns" not in key["data"]  # the key of runs without the flag
    mapped = cache_key(DataConfig(data_columns=("prompt=query",)), tok, "train", 1, 1)
    assert mapped["data"]["data_columns"] == ("prompt=query",)


def test_preflight_names_the_file_the_schemas_and_the_flag(query_file, capsys):
    argv = ["sft", "--model_name_or_path", "tiny", "--data_path", str(query_file)]
    assert preflight_main(argv) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if str(query_file) in x]
    assert line.startswith(f"preflight: --data_path {query_file}: no known dataset schema")
    assert known_schemas() in line
    assert preflight_main([*argv, "--data_columns", "prompt=query,chosen=response"]) == 0
    # a forced adapter whose columns are not there
    assert preflight_main(["sft", "--data_path", f"hh:{query_file}"]) == 2
    assert "the Dahoas/full-hh-rlhf adapter needs the columns chosen, prompt, rejected" in (
        capsys.readouterr().err
    )
