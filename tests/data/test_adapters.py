"""Each adapter on small local files written in the exact Hugging Face schema of its dataset."""

import json
import logging

import pytest

from marlhf.data.adapters import ADAPTERS, get_adapter
from marlhf.data.schema import DataError
from marlhf.data.sources import carve, load_examples


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tldr_row(i, split="train", post="My dog ate my lunch.", sub="pets", choice=1):
    return {
        "info": {
            "id": f"t3_{i}",
            "post": post,
            "title": "t",
            "subreddit": sub,
            "site": None,
            "article": None,
        },
        "summaries": [
            {"text": f" bad {i}", "policy": "sup1", "note": None},
            {"text": f" good {i}", "policy": "sup2", "note": None},
        ],
        "choice": choice,
        "worker": "w1",
        "batch": "batch3",
        "split": split,
        "extra": {"confidence": 7},
    }


def test_tldr_template_and_split_field(tmp_path):
    rows = [tldr_row(0), tldr_row(1, "valid1"), tldr_row(2, "valid2", choice=0)]
    rows.append(tldr_row(3))
    rows[3]["info"].update(post=None, article="Stocks fell.", subreddit=None)
    f = write_jsonl(tmp_path / "cmp.jsonl", rows)
    train, n_bad = load_examples(str(f), "train")
    assert n_bad == 0 and len(train) == 2
    assert train[0].prompt == "POST\nSubreddit: r/pets\nMy dog ate my lunch.\nTL;DR: "
    assert (train[0].chosen, train[0].rejected) == (" good 0", " bad 0")
    assert train[0].prompt_id == "tldr/t3_0" and train[0].meta == {"subreddit": "pets"}
    assert train[1].prompt == "ARTICLE\nStocks fell.\nTL;DR: "  # article variant, no subreddit line
    evals, _ = load_examples(str(f), "eval")
    assert [e.prompt_id for e in evals] == ["tldr/t3_1", "tldr/t3_2"]
    assert evals[1].chosen == " bad 2"


def test_hh_columns(tmp_path):
    row = {
        "prompt": "\n\nHuman: Hi?\n\nAssistant:",
        "response": " Hello.",
        "chosen": " Hello.",
        "rejected": " Go away.",
    }
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps(dict(row, chosen=" Hey.")) + "\n")
    train, _ = load_examples(f"hh:{tmp_path}", "train")
    test, _ = load_examples(str(tmp_path), "eval")  # detected by columns
    assert train[0].prompt == "\n\nHuman: Hi?\n\nAssistant:"
    assert (train[0].chosen, train[0].rejected) == (" Hello.", " Go away.")
    assert test[0].chosen == " Hey."


def webgpt_row(i, s0, s1, a0="Paris is the capital [1].", a1="It is Lyon [2, 3]."):
    return {
        "question": {
            "dataset": "eli5",
            "id": f"q{i}",
            "full_text": "What is the capital of France?",
        },
        "quotes_0": {"title": ["Wiki"], "extract": ["Paris ..."]},
        "answer_0": a0,
        "tokens_0": [1, 2],
        "score_0": s0,
        "quotes_1": {"title": [], "extract": []},
        "answer_1": a1,
        "tokens_1": [3],
        "score_1": s1,
    }


def test_webgpt_choice_ties_citations_and_carve(tmp_path):
    rows = [webgpt_row(0, -1.0, 1.0), webgpt_row(1, 0.0, 0.0)] + [
        webgpt_row(i, 1.0, 0.0) for i in range(2, 40)
    ]
    f = write_jsonl(tmp_path / "webgpt.jsonl", rows)
    train, _ = load_examples(f"webgpt:{f}", "train")
    evals, _ = load_examples(f"webgpt:{f}", "eval")
    # 95/5 carve of 40 rows: 2 eval rows, disjoint from train, same every time.
    ids = [e.prompt_id for e in train] + [e.prompt_id for e in evals]
    assert len(evals) == 2 and sorted(ids) == sorted(f"webgpt/q{i}" for i in range(40))
    assert sorted(carve(40, "eval").tolist() + carve(40, "train").tolist()) == list(range(40))
    by_id = {e.prompt_id: e for e in train + evals}
    assert by_id["webgpt/q0"].prompt == " Human: What is the capital of France? Assistant:"
    # higher score, citations removed, a space after "Assistant:" (as DeepSpeed-Chat)
    assert by_id["webgpt/q0"].chosen == " It is Lyon."
    assert by_id["webgpt/q0"].rejected == " Paris is the capital."
    assert by_id["webgpt/q1"].chosen == " Paris is the capital."  # tie -> answer_0
    skipped, _ = load_examples(f"webgpt:{f}", "train", webgpt_skip_ties=True)
    skipped_e, _ = load_examples(f"webgpt:{f}", "eval", webgpt_skip_ties=True)
    assert "webgpt/q1" not in {e.prompt_id for e in skipped + skipped_e}
    assert len(skipped) + len(skipped_e) == 39


def test_apps(tmp_path):
    rows = [
        {
            "problem_id": 7,
            "question": "Add two numbers.",
            "solutions": json.dumps(["a,b=map(int,input().split())\nprint(a+b)", "print(0)"]),
            "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
            "difficulty": "introductory",
            "url": "u",
            "starter_code": "",
        },
        {
            "problem_id": 8,
            "question": "Write f.",
            "solutions": "",
            "input_output": json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [2]}),
            "difficulty": "interview",
            "url": "u",
            "starter_code": "def f(x):",
        },
    ]
    f = write_jsonl(tmp_path / "train.jsonl", rows)
    exs, _ = load_examples(str(f.parent), "train")
    assert exs[0].prompt == "\nQUESTION:\nAdd two numbers.\n\nUse Standard Input format\nANSWER:\n"
    assert exs[0].chosen.startswith("a,b=map") and exs[0].rejected is None
    assert json.loads(exs[0].meta["tests"])["outputs"] == ["3\n"] and exs[0].meta["fn_name"] is None
    assert exs[1].prompt == "\nQUESTION:\nWrite f.\ndef f(x):\n\nUse Call-Based format\nANSWER:\n"
    assert exs[1].chosen is None and exs[1].meta["fn_name"] == "f"
    assert exs[1].prompt_id == "apps/8"


def test_apps_tests_with_integers_beyond_the_digit_limit(tmp_path):
    # APPS holds test numbers of 9000+ digits; json.loads refuses those beyond 4300 by default
    big = "9" * 5000
    io = '{"fn_name": "f", "inputs": [[' + big + ']], "outputs": [[1]]}'
    row = {"problem_id": 1, "question": "Q", "solutions": "[]", "input_output": io}
    (ex,), _ = load_examples(str(write_jsonl(tmp_path / "train.jsonl", [row]).parent), "train")
    assert ex.meta["fn_name"] == "f" and ex.meta["tests"] == io


def test_plain_with_margin_and_parquet(tmp_path):
    import datasets

    rows = {
        "prompt": ["Q1", "Q2"],
        "chosen": ["A", "B"],
        "rejected": ["x", "y"],
        "margin": [0.5, 2.0],
    }
    f = tmp_path / "pairs.parquet"
    datasets.Dataset.from_dict(rows).to_parquet(str(f))
    exs, _ = load_examples(f"plain:{f}", "train")
    evals, _ = load_examples(f"plain:{f}", "eval")
    assert len(exs) + len(evals) == 2
    ex = {e.prompt: e for e in exs + evals}
    assert (ex["Q2"].chosen, ex["Q2"].rejected, ex["Q2"].margin) == ("B", "y", 2.0)


def test_prompt_only_plain_file(tmp_path):
    f = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "P1"}, {"prompt": "P2"}])
    exs, _ = load_examples(str(tmp_path), "train")
    assert [(e.prompt, e.chosen, e.rejected) for e in exs] == [
        ("P1", None, None),
        ("P2", None, None),
    ]
    assert f.exists()


def test_bundled_synthetic():
    train, _ = load_examples("synthetic-tldr", "train")
    evals, _ = load_examples("synthetic-tldr", "eval")
    assert len(train) == 1900 and len(evals) == 300
    assert train[0].prompt.startswith("POST\nSubreddit: r/") and train[0].prompt.endswith(
        "\nTL;DR: "
    )
    assert not {e.prompt_id for e in train} & {e.prompt_id for e in evals}
    capped, _ = load_examples("synthetic-tldr", "train", max_samples=5)
    assert [e.prompt_id for e in capped] == [e.prompt_id for e in train[:5]]


def test_registry():
    for name in (
        "openai/summarize_from_feedback",
        "Dahoas/full-hh-rlhf",
        "Dahoas/rm-static",
        "openai/webgpt_comparisons",
        "codeparrot/apps",
    ):
        assert ADAPTERS[name].hub_id == name
    assert ADAPTERS["openai/summarize_from_feedback"].hub_config == "comparisons"
    assert ADAPTERS["Dahoas/full-hh-rlhf"].splits == {"train": "train", "eval": "test"}
    with pytest.raises(ValueError, match="neither a local path nor a known dataset"):
        get_adapter("nope/nothing")


# --- bad rows ------------------------------------------------------------------------------------
def plain_rows():
    return [{"prompt": f"P{i}", "chosen": f"C{i}", "rejected": f"R{i}"} for i in range(5)]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("chosen"), 'line 3: field "chosen" missing'),
        (lambda r: r.update(chosen="  "), 'line 3: field "chosen" is empty'),
        (lambda r: r.update(rejected=5), 'line 3: field "rejected" must be a string'),
    ],
)
def test_bad_row_names_file_line_field(tmp_path, mutate, message):
    rows = plain_rows()
    mutate(rows[2])
    f = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as err:
        load_examples(f"plain:{f}", "train")
    assert str(err.value) == f"{f} {message}" or str(err.value).startswith(f"{f} {message}")


def test_unparseable_line_and_skip_mode(tmp_path, caplog):
    rows = plain_rows()
    rows[1].pop("chosen")
    text = "".join(json.dumps(r) + "\n" for r in rows)
    lines = text.splitlines(keepends=True)
    lines.insert(3, "{not json\n")  # becomes line 4
    f = tmp_path / "train.jsonl"
    f.write_text("".join(lines))
    # Every line is checked for JSON before any row is read: the first error is line 4.
    with pytest.raises(DataError, match=r"train\.jsonl line 4: not valid JSON"):
        load_examples(f"plain:{f}", "train")
    rows_ok = plain_rows()
    g = tmp_path / "g.jsonl"
    g.write_text(json.dumps(rows_ok[0]) + "\n\n" + "{not json\n")
    with pytest.raises(DataError, match=r"g\.jsonl line 3: not valid JSON"):
        load_examples(f"plain:{g}", "train")
    with caplog.at_level(logging.WARNING):
        tr, bad_tr = load_examples(f"plain:{f}", "train", skip_bad_rows=True)
        ev, bad_ev = load_examples(f"plain:{f}", "eval", skip_bad_rows=True)
    # 5 good JSON rows minus the one without chosen; the unparseable line is counted in both splits'
    # reads (it is found while reading the file), the missing field once (in the split holding it).
    assert len(tr) + len(ev) == 4
    assert bad_tr >= 1 and bad_ev >= 1 and bad_tr + bad_ev == 3
    assert "skipped" in caplog.text


def test_tldr_bad_choice_names_field(tmp_path):
    row = tldr_row(0)
    row["choice"] = 2
    f = write_jsonl(tmp_path / "x.jsonl", [tldr_row(1), row])
    with pytest.raises(DataError, match=r'x\.jsonl line 2: field "choice" must be 0 or 1'):
        load_examples(str(f), "train")
    row = tldr_row(0)
    del row["summaries"][1]["text"]
    f = write_jsonl(tmp_path / "y.jsonl", [row])
    with pytest.raises(DataError, match=r'y\.jsonl line 1: field "summaries\[1\]\.text" missing'):
        load_examples(str(f), "train")


def test_hub_loading_offline_names_dataset():
    # The hub path is real code; here (offline) it must fail with a message naming the dataset.
    with pytest.raises(DataError, match="Dahoas/rm-static: cannot load from the hub"):
        load_examples("Dahoas/rm-static", "train")


def test_directory_with_only_train_files_is_carved(tmp_path):
    rows = [{"prompt": f"P{i}", "chosen": "c", "rejected": "r"} for i in range(40)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    train, _ = load_examples(str(tmp_path), "train")
    evals, _ = load_examples(str(tmp_path), "eval")
    assert len(evals) == 2 and len(train) == 38
    assert not {e.prompt for e in train} & {e.prompt for e in evals}


def test_missing_local_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_examples(f"plain:{tmp_path / 'nope.jsonl'}", "train")


# --- encodings -----------------------------------------------------------------------------------
def test_bytes_that_are_not_utf8_name_the_line_and_skip(tmp_path):
    lines = [json.dumps(r).encode() for r in plain_rows()]
    lines[2] = lines[2].replace(b"C2", b"C\xe92")  # "Cé2" in Latin-1: not UTF-8
    f = tmp_path / "train.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError, match=r"train\.jsonl line 3: not valid UTF-8 \(byte 0xe9"):
        load_examples(f"plain:{f}", "train")
    tr, bad_tr = load_examples(f"plain:{f}", "train", skip_bad_rows=True)
    ev, _ = load_examples(f"plain:{f}", "eval", skip_bad_rows=True)
    assert bad_tr == 1 and sorted(e.prompt for e in tr + ev) == ["P0", "P1", "P3", "P4"]
    # the same in a .json array (its rows are numbered from 1)
    g = tmp_path / "pairs.json"
    g.write_bytes(json.dumps(plain_rows()).encode().replace(b"C2", b"C\xe92"))
    with pytest.raises(DataError, match=r"pairs\.json row 3: holds '\\udce9', which is not valid"):
        load_examples(f"plain:{g}", "train")
    tr, bad = load_examples(f"plain:{g}", "train", skip_bad_rows=True)
    assert bad == 1 and len(tr) == 4
    # a lone surrogate escape decodes to text no tokenizer can encode: a bad row too; a pair is fine
    h = tmp_path / "esc.jsonl"
    h.write_text('{"prompt": "P\\ud83d\\ude00", "chosen": "c", "rejected": "r"}\n' * 30)
    assert load_examples(f"plain:{h}", "train")[0][0].prompt == "P\U0001f600"
    h.write_text(h.read_text() + '{"prompt": "P\\udcff", "chosen": "c", "rejected": "r"}\n')
    with pytest.raises(DataError, match=r"esc\.jsonl line 31: holds '\\udcff', which is not valid"):
        load_examples(f"plain:{h}", "train")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_utf8_byte_order_mark_is_accepted(tmp_path, suffix):
    rows = plain_rows()
    body = "".join(json.dumps(r) + "\n" for r in rows) if suffix == ".jsonl" else json.dumps(rows)
    f = tmp_path / f"train{suffix}"
    f.write_bytes(b"\xef\xbb\xbf" + body.encode())
    for skip in (False, True):
        tr, bad = load_examples(f"plain:{f}", "train", skip_bad_rows=skip)
        ev, _ = load_examples(f"plain:{f}", "eval", skip_bad_rows=skip)
        assert bad == 0 and sorted(e.prompt for e in tr + ev) == [f"P{i}" for i in range(5)]


# --- TL;DR "choice": one rule whatever else the file holds ----------------------------------------
@pytest.mark.parametrize("choice", ["1", 1.0, True])
def test_tldr_choice_must_be_an_integer_in_clean_and_broken_files(tmp_path, choice):
    rows = [tldr_row(i) for i in range(4)]
    rows[2]["choice"] = choice
    text = "".join(json.dumps(r) + "\n" for r in rows)
    clean, broken = tmp_path / "clean.jsonl", tmp_path / "broken.jsonl"
    clean.write_text(text)
    broken.write_text(text + "{not json\n")
    with pytest.raises(DataError, match=r'clean\.jsonl line 3: field "choice" must be 0 or 1'):
        load_examples(str(clean), "train")
    with pytest.raises(DataError, match=r"broken\.jsonl line 5: not valid JSON"):  # read first
        load_examples(str(broken), "train")
    # with --skip_bad_rows the row is skipped in both files (plus the broken line)
    assert load_examples(str(clean), "train", skip_bad_rows=True)[1] == 1
    assert load_examples(str(broken), "train", skip_bad_rows=True)[1] == 2
    exs, _ = load_examples(str(broken), "train", skip_bad_rows=True)
    assert [e.prompt_id for e in exs] == ["tldr/t3_0", "tldr/t3_1", "tldr/t3_3"]


def test_webgpt_answer_follows_assistant_with_a_space(tmp_path):
    f = write_jsonl(tmp_path / "w.jsonl", [webgpt_row(i, 1.0, 0.0) for i in range(20)])
    (ex, *_), _ = load_examples(f"webgpt:{f}", "train")
    assert (
        ex.prompt + ex.chosen
        == " Human: What is the capital of France? Assistant: Paris is the capital."
    )
    assert (
        ex.prompt + ex.rejected == " Human: What is the capital of France? Assistant: It is Lyon."
    )


# --- CSV and TSV ---------------------------------------------------------------------------------
def test_csv_and_tsv_read_like_jsonl(tmp_path):
    """The same rows as CSV (quoted cells with commas, quotes and a line break), TSV and JSON
    lines give the same examples; an empty cell is a missing value; margin reads its text."""
    rows = [
        {"prompt": 'He said "hi", twice.\nTL;DR:', "chosen": " hi, hi", "rejected": " no",
         "margin": 0.5},
        {"prompt": "Second", "chosen": " yes", "rejected": " no"},  # no margin: an empty cell
    ]  # fmt: skip
    write_jsonl(tmp_path / "ref.jsonl", rows)
    (tmp_path / "pairs.csv").write_text(
        "prompt,chosen,rejected,margin\n"
        '"He said ""hi"", twice.\nTL;DR:"," hi, hi", no,0.5\n'
        "\n"  # a blank line is no record
        "Second, yes, no,\n"
    )
    (tmp_path / "pairs.tsv").write_text(
        'prompt\tchosen\trejected\tmargin\n"He said ""hi"", twice.\nTL;DR:"\t hi, hi\t no\t0.5\n'
        "Second\t yes\t no\t\n"
    )
    ref, _ = load_examples(f"plain:{tmp_path / 'ref.jsonl'}", "train")
    for name in ("pairs.csv", "pairs.tsv"):
        got, _ = load_examples(f"plain:{tmp_path / name}", "train")
        assert got == ref, name
    assert (ref[0].margin, ref[1].margin) == (0.5, None)
    # detected by columns like any local file, and in a directory of split files
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.csv").write_text((tmp_path / "pairs.csv").read_text())
    (tmp_path / "d" / "test.csv").write_text("prompt,chosen,rejected\nQ, a, b\n")
    train, _ = load_examples(str(tmp_path / "d"), "train")
    evals, _ = load_examples(str(tmp_path / "d"), "eval")
    assert train == ref and [(e.prompt, e.chosen, e.rejected) for e in evals] == [("Q", " a", " b")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt,chosen\nP1,C1\nP2,C2,extra\n", "line 3: 3 cells, the header has 2 (prompt, chosen)"),
        ("prompt,chosen\nP1,C1\n\n\"P2\nstill P2\",\n", 'line 4: field "chosen" missing'),
        ("prompt,chosen,margin\nP1,C1,lots\n", "line 2: field \"margin\" must be a number, got 'lots'"),
        ("prompt,prompt\nP1,C1\n", "line 1: the CSV header: columns ['prompt'] repeat"),
        ('prompt,chosen\n"P1,C1\n', "line 2: not valid CSV"),
    ],
)  # fmt: skip
def test_bad_csv_row_names_file_line_field(tmp_path, text, message):
    f = tmp_path / "train.csv"
    f.write_text(text)
    with pytest.raises(DataError) as err:
        load_examples(f"plain:{f}", "train")
    assert str(err.value).startswith(f"{f} {message}"), str(err.value)


def test_bad_csv_rows_are_skipped_and_counted(tmp_path):
    f = tmp_path / "train.csv"
    f.write_bytes(b"prompt,chosen\nP1,C1\nP2,C2,extra\nP3,caf\xe9\nP4,C4\n")
    with pytest.raises(DataError, match=r"train\.csv line 3: 3 cells"):
        load_examples(f"plain:{f}", "train")
    exs, bad = load_examples(f"plain:{f}", "train", skip_bad_rows=True)
    assert [e.prompt for e in exs] == ["P1", "P4"] and bad == 2
