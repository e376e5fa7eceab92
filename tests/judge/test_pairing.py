import doctest
import json

import pytest

import marlhf.judge.pairing as pairing_mod
from marlhf.judge.pairing import PairingError, align_results, load_results


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_doctests():
    assert doctest.testmod(pairing_mod).failed == 0


def test_align_by_prompt_text_any_order(tmp_path):
    a = write(
        tmp_path / "a.jsonl",
        [{"prompt": f"p{i}", "response": f"a{i}", "reward": 1.0} for i in range(3)],
    )
    b = write(tmp_path / "b.jsonl", [{"prompt": f"p{i}", "response": f"b{i}"} for i in (2, 0, 1)])
    pairs = align_results(a, b)
    assert [(p.prompt, p.response_a, p.response_b) for p in pairs] == [
        ("p0", "a0", "b0"),
        ("p1", "a1", "b1"),
        ("p2", "a2", "b2"),
    ]
    assert pairs[0].extra == {"reward": 1.0}


def test_align_by_prompt_id_when_both_have_it(tmp_path):
    a = write(
        tmp_path / "a.jsonl",
        [
            {"prompt_id": "x", "prompt": "same", "response": "ra"},
            {"prompt_id": "y", "prompt": "same", "response": "ra2"},
        ],
    )
    b = write(
        tmp_path / "b.jsonl",
        [
            {"prompt_id": "y", "prompt": "same", "response": "rb2"},
            {"prompt_id": "x", "prompt": "same", "response": "rb"},
        ],
    )
    pairs = align_results(a, b)  # same prompt text twice is fine when ids differ
    assert [(p.prompt_id, p.response_a, p.response_b) for p in pairs] == [
        ("x", "ra", "rb"),
        ("y", "ra2", "rb2"),
    ]


def test_missing_prompt_names_both_files(tmp_path):
    a = write(
        tmp_path / "model_a.jsonl",
        [{"prompt": p, "response": "r"} for p in ("p1", "p2", "only in a")],
    )
    b = write(tmp_path / "model_b.jsonl", [{"prompt": p, "response": "r"} for p in ("p1", "p2")])
    with pytest.raises(PairingError) as err:
        align_results(a, b)
    msg = str(err.value)
    assert "model_a.jsonl" in msg and "model_b.jsonl" in msg and "only in a" in msg


def test_duplicate_and_bad_lines(tmp_path):
    a = write(
        tmp_path / "a.jsonl", [{"prompt": "p", "response": "r"}, {"prompt": "p", "response": "s"}]
    )
    b = write(tmp_path / "b.jsonl", [{"prompt": "p", "response": "r"}])
    with pytest.raises(PairingError, match=r"a\.jsonl.*twice.*lines 1 and 2"):
        align_results(a, b)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "response": "r"}\n{oops\n')
    with pytest.raises(PairingError, match=r"bad\.jsonl line 2: not valid JSON"):
        load_results(bad)
    nores = write(tmp_path / "nores.jsonl", [{"prompt": "p"}])
    with pytest.raises(PairingError, match=r'nores\.jsonl line 1: field "response"'):
        load_results(nores)
    with pytest.raises(PairingError, match="cannot read"):
        load_results(tmp_path / "missing.jsonl")


def test_same_id_different_prompt_is_an_error(tmp_path):
    a = write(tmp_path / "a.jsonl", [{"prompt_id": "1", "prompt": "p", "response": "r"}])
    b = write(tmp_path / "b.jsonl", [{"prompt_id": "1", "prompt": "q", "response": "r"}])
    with pytest.raises(PairingError, match="different prompt text"):
        align_results(a, b)


def test_one_row_without_prompt_id_is_an_error(tmp_path):
    """One row lacking prompt_id is an error naming the file and the line (not a silent switch of
    both files to matching by prompt text)."""
    rows = [{"prompt_id": f"id{i}", "prompt": f"p{i}", "response": "r"} for i in range(4)]
    a = write(tmp_path / "a.jsonl", rows)
    rows_b = [dict(r) for r in rows]
    del rows_b[2]["prompt_id"]
    b = write(tmp_path / "b.jsonl", rows_b)
    with pytest.raises(
        PairingError, match=r'b\.jsonl line 3: field "prompt_id" missing, while line 1'
    ):
        align_results(a, b)
    # a file without any prompt_id is matched by text, and the caller is told
    c = write(tmp_path / "c.jsonl", [{"prompt": f"p{i}", "response": "c"} for i in range(4)])
    notes = []
    pairs = align_results(a, c, on_note=notes.append)
    assert [p.response_b for p in pairs] == ["c"] * 4
    assert len(notes) == 1 and "c.jsonl has no prompt_id" in notes[0] and "prompt text" in notes[0]


def test_invalid_json_names_the_column(tmp_path):
    """A JSON error names line and column."""
    bad = tmp_path / "bad.jsonl"
    ok = json.dumps({"prompt": "p", "response": "r"})
    bad.write_text(ok + "\n" + '{"prompt": "p", "response": "tab\there"}\n')  # raw control char
    with pytest.raises(PairingError) as err:
        load_results(bad)
    col = '{"prompt": "p", "response": "tab'.__len__() + 1  # 1-based column of the tab
    assert f"bad.jsonl line 2: not valid JSON at column {col} (Invalid control character" in str(
        err.value
    )
