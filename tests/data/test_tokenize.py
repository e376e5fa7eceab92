"""Tokenised datasets against hand-built id sequences."""

import json
import logging
import math

import pytest

import marlhf.data.tokenize as T
from marlhf.data.collate import PairCollator, PromptCollator, SFTCollator
from marlhf.data.config import DataConfig
from marlhf.data.schema import DataError

ROWS = [
    {
        "prompt": "POST\nMy dog ate my lunch.\nTL;DR: ",
        "chosen": "my dog ate my lunch",
        "rejected": "my cat",
        "margin": 1.5,
    },
    {
        "prompt": "POST\nSorry for the long post.\nTL;DR: ",
        "chosen": "nothing",
        "rejected": "my boss quit the band",
    },
]


@pytest.fixture()
def data_file(tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return f


def cfg_for(f, tmp_path, **kw):
    # "1,0,0" puts every row in phase 1; "0,1,0" / "0,0,1" in phase 2 / 3. Two rows -> all train.
    kw.setdefault("data_split", "1,0,0")
    return DataConfig(data_path=(f"plain:{f}",), data_output_path=str(tmp_path / "cache"), **kw)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def by_prompt_len(ds, key="input_ids"):
    return sorted((list(r[key]) for r in ds), key=len)


def test_sft_labels_hand_built(tok, data_file, tmp_path):
    ds = T.build_sft_dataset(cfg_for(data_file, tmp_path), tok, "train", seed=0)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    expected = []
    for r in ROWS:
        p, c = ids(tok, r["prompt"]), ids(tok, r["chosen"])
        expected.append(([bos] + p + c + [eos], [-100] * (1 + len(p)) + c + [eos]))
    got = sorted(((list(r["input_ids"]), list(r["labels"])) for r in ds), key=lambda x: len(x[0]))
    assert got == sorted(expected, key=lambda x: len(x[0]))
    # Collated: padding gets pad ids, attention 0 and label -100.
    batch = SFTCollator(tok.pad_token_id)([ds[0], ds[1]])
    for i, (ids_i, lab_i) in enumerate(
        [
            (list(ds[0]["input_ids"]), list(ds[0]["labels"])),
            (list(ds[1]["input_ids"]), list(ds[1]["labels"])),
        ]
    ):
        n, width = len(ids_i), batch["input_ids"].shape[1]
        assert batch["input_ids"][i].tolist() == ids_i + [tok.pad_token_id] * (width - n)
        assert batch["labels"][i].tolist() == lab_i + [-100] * (width - n)
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (width - n)


def test_sft_prompt_loss_no_bos_and_custom_eot(tok_nobos, data_file, tmp_path):
    # a custom end-of-conversation token must be one token of the tokenizer (";" is one here)
    cfg = cfg_for(data_file, tmp_path, sft_include_prompt_loss=True, end_of_conversation_token=";")
    ds = T.build_sft_dataset(cfg, tok_nobos, "train", seed=0)
    eot = ids(tok_nobos, ";")
    assert len(eot) == 1 and eot != [tok_nobos.eos_token_id]
    for r in ds:
        assert r["labels"] == r["input_ids"]
        assert r["input_ids"][-len(eot) :] == eot and r["input_ids"][0] != tok_nobos.bos_token_id
    assert T.bos_prefix(tok_nobos) == [] and T.eot_ids(cfg, tok_nobos) == eot


def test_truncation_keeps_response_start(tok, data_file, tmp_path):
    cfg = cfg_for(data_file, tmp_path, max_seq_len=12)
    ds = T.build_sft_dataset(cfg, tok, "train", seed=0)
    for r in ds:
        assert len(r["input_ids"]) <= 12 and r["input_ids"][0] == tok.bos_token_id
        n_prompt = sum(lab == -100 for lab in r["labels"])
        resp = r["input_ids"][n_prompt:]
        source = next(
            x
            for x in ROWS
            if ids(tok, x["chosen"])[: len(resp)] == resp[: len(ids(tok, x["chosen"]))]
        )
        p = ids(tok, source["prompt"])
        assert (
            r["input_ids"][1:n_prompt] == p[len(p) - (n_prompt - 1) :]
        )  # prompt cut from the left


def test_fit_hand_worked():
    assert T.fit([1, 2, 3, 4], [[5, 6]], 10) == ([1, 2, 3, 4], [[5, 6]])
    # Budget 5: the prompt keeps max(min(4, 2), 5 - 6) = 2 tokens from its end; responses get 3.
    assert T.fit([1, 2, 3, 4], [[5, 6, 7, 8, 9, 10], [11]], 5) == ([3, 4], [[5, 6, 7], [11]])
    # A short response lets the prompt keep more than half.
    assert T.fit([1, 2, 3, 4, 5, 6], [[7]], 5) == ([3, 4, 5, 6], [[7]])


def test_pair_dataset_and_collator(tok, data_file, tmp_path):
    ds = T.build_pair_dataset(
        cfg_for(data_file, tmp_path, data_split="0,1,0"), tok, "train", seed=0
    )
    assert len(ds) == 2
    bos, eos = tok.bos_token_id, tok.eos_token_id
    rows = {r["prompt_len"]: r for r in ds}
    for src in ROWS:
        p = ids(tok, src["prompt"])
        r = rows[1 + len(p)]
        assert r["chosen_input_ids"] == [bos] + p + ids(tok, src["chosen"]) + [eos]
        assert r["rejected_input_ids"] == [bos] + p + ids(tok, src["rejected"]) + [eos]
        if "margin" in src:
            assert r["margin"] == src["margin"]
        else:
            assert math.isnan(r["margin"])
    b = PairCollator(tok.pad_token_id)([ds[0], ds[1]])
    seqs = [
        ds[0]["chosen_input_ids"],
        ds[1]["chosen_input_ids"],
        ds[0]["rejected_input_ids"],
        ds[1]["rejected_input_ids"],
    ]
    width = max(map(len, seqs))
    assert b["input_ids"].tolist() == [s + [tok.pad_token_id] * (width - len(s)) for s in seqs]
    assert b["attention_mask"].tolist() == [[1] * len(s) + [0] * (width - len(s)) for s in seqs]
    assert b["prompt_len"].tolist() == [ds[0]["prompt_len"], ds[1]["prompt_len"]]


def test_prompt_dataset_drop_and_truncate(tok, data_file, tmp_path):
    cfg = cfg_for(data_file, tmp_path, data_split="0,0,1")
    lens = sorted(1 + len(ids(tok, r["prompt"])) for r in ROWS)
    limit = lens[0]  # the shorter prompt fits exactly, the longer does not
    ds, dropped = T.build_prompt_dataset(cfg, tok, "train", 0, max_prompt_len=limit)
    assert dropped == 1 and len(ds) == 1 and len(ds[0]["input_ids"]) == limit
    ds2, dropped2 = T.build_prompt_dataset(cfg, tok, "train", 0, max_prompt_len=limit)  # cached
    assert dropped2 == 1 and ds2[0]["input_ids"] == ds[0]["input_ids"]
    dt, d0 = T.build_prompt_dataset(
        cfg, tok, "train", 0, max_prompt_len=limit, overlong="truncate_left"
    )
    # truncate_left keeps every prompt and still reports the over-long one (it was cut)
    assert d0 == 1 and len(dt) == 2
    for r in dt:
        p = ids(tok, r["prompt"])
        assert r["input_ids"] == [tok.bos_token_id] + p[max(0, len(p) - (limit - 1)) :]
        assert json.loads(r["meta"]) == {} and r["prompt_id"].startswith("local/")
    b = PromptCollator(tok.pad_token_id)([dt[0], dt[1]])
    a, c = dt[0]["input_ids"], dt[1]["input_ids"]
    w = max(len(a), len(c))
    assert b["input_ids"].tolist() == [[tok.pad_token_id] * (w - len(x)) + x for x in (a, c)]
    assert b["attention_mask"].tolist() == [[0] * (w - len(x)) + [1] * len(x) for x in (a, c)]
    assert b["prompt_id"] == [dt[0]["prompt_id"], dt[1]["prompt_id"]]


def test_cache_hit_and_source_change(tok, data_file, tmp_path, monkeypatch):
    calls = []
    real = T._phase_examples
    monkeypatch.setattr(T, "_phase_examples", lambda *a: calls.append(a) or real(*a))
    cfg = cfg_for(data_file, tmp_path)
    T.build_sft_dataset(cfg, tok, "train", 0)
    T.build_sft_dataset(cfg, tok, "train", 0)
    assert len(calls) == 1  # second call loaded the cache
    T.build_sft_dataset(cfg_for(data_file, tmp_path, max_seq_len=100), tok, "train", 0)
    assert len(calls) == 2  # changed option -> rebuilt
    data_file.write_text(data_file.read_text() + json.dumps(ROWS[0]) + "\n")
    ds = T.build_sft_dataset(cfg, tok, "train", 0)
    assert len(calls) == 3 and len(ds) == 3  # changed file -> rebuilt


def test_tokenizer_hashed_once_per_stage_and_again_when_it_changes(data_file, tmp_path):
    """A stage's data sets (train, eval, prompts, ...) share one tokenizer: its vocabulary is hashed once;
    a token added or a special token set changes the fingerprint, which is then recomputed."""
    from tests.data.conftest import make_tokenizer

    tok = make_tokenizer(add_bos=True)
    reads = []
    real = tok.get_vocab
    tok.get_vocab = lambda: reads.append(1) or real()
    cfg = cfg_for(data_file, tmp_path)
    first = T.tokenizer_fingerprint(tok)
    T.build_sft_dataset(cfg, tok, "train", 0)
    T.build_pair_dataset(cfg_for(data_file, tmp_path, data_split="0,1,0"), tok, "train", 0)
    T.build_prompt_dataset(cfg_for(data_file, tmp_path, data_split="0,0,1"), tok, "train", 0, 64)
    assert len(reads) == 1
    tok.add_tokens(["zzzunseen"])
    added = T.tokenizer_fingerprint(tok)
    assert added != first and len(reads) == 2
    # an independent reference: a fresh copy of the changed tokenizer, never memoised
    fresh = make_tokenizer(add_bos=True)
    fresh.add_tokens(["zzzunseen"])
    assert T.tokenizer_fingerprint(fresh)["vocab_sha256"] == added["vocab_sha256"]


def test_csv_data_gives_the_sets_jsonl_gives(tok, data_file, tmp_path):
    """SFT examples, reward-model pairs (a margin in one row, an empty cell in the other) and PPO
    prompts from a CSV file of the rows equal those from the JSON lines (``--data_path
    pairs.csv``)."""
    import csv

    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    f = tmp_path / "pairs.csv"
    with open(f, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["prompt", "chosen", "rejected", "margin"])
        writer.writeheader()
        writer.writerows(rows)
    for split in ("1,0,0", "0,1,0", "0,0,1"):
        a, b = (cfg_for(p, tmp_path, data_split=split) for p in (data_file, f))
        if split == "1,0,0":
            sets = [T.build_sft_dataset(c, tok, "train", 0) for c in (a, b)]
        elif split == "0,1,0":
            sets = [T.build_pair_dataset(c, tok, "train", 0) for c in (a, b)]
        else:
            sets = [T.build_prompt_dataset(c, tok, "train", 0, 64)[0] for c in (a, b)]
        as_json = [json.dumps(s.to_list()) for s in sets]  # NaN margins compare as text
        assert len(sets[0]) == len(rows) and as_json[0] == as_json[1], split


def test_phases_partition_bundled(tok, tmp_path):
    cfg = DataConfig(data_output_path=str(tmp_path), max_samples=60)
    a = T._phase_examples(cfg, "train", 1234, 1)
    b = T._phase_examples(cfg, "train", 1234, 2)
    c = T._phase_examples(cfg, "train", 1234, 3)
    assert (len(a), len(b), len(c)) == (12, 24, 24)
    assert len({e.prompt_id for e in a + b + c}) == 60


# --- --data_seed: the phase split's own seed ----------------------------------------------------
def _phase_ids(split_seed, phase, n=60):
    """Prompt ids of ``phase`` of the bundled train split, from the raw rows and ``phase_indices``."""
    from marlhf.data.sources import load_examples
    from marlhf.data.split import phase_indices

    exs, _ = load_examples("synthetic-tldr", "train", max_samples=n)
    return [exs[i].prompt_id for i in phase_indices(len(exs), "2,4,4", phase, split_seed)]


def test_data_seed_fixes_the_split_whatever_the_seed(tok, tmp_path, monkeypatch):
    """PPO prompts (phase 3) and SFT rows (phase 1): two stage seeds with one --data_seed see the
    same rows, built once (one cache entry); another --data_seed sees other rows."""
    calls = []
    real = T._phase_examples
    monkeypatch.setattr(T, "_phase_examples", lambda *a: calls.append(a) or real(*a))

    def prompts(seed, **kw):
        cfg = DataConfig(data_output_path=str(tmp_path / "cache"), max_samples=60, **kw)
        ds, _ = T.build_prompt_dataset(cfg, tok, "train", seed, max_prompt_len=4096)
        return list(ds["prompt_id"])

    def sft(seed, **kw):
        cfg = DataConfig(data_output_path=str(tmp_path / "cache"), max_samples=60, **kw)
        return [list(x) for x in T.build_sft_dataset(cfg, tok, "train", seed)["input_ids"]]

    a = prompts(1, data_seed=7)
    assert a == _phase_ids(7, 3)
    assert prompts(2, data_seed=7) == a
    assert len(calls) == 1, "the second seed must load the first one's cache entry"
    other = prompts(1, data_seed=8)
    assert other == _phase_ids(8, 3) and set(other) != set(a)
    assert len(calls) == 2
    assert sft(1, data_seed=7) == sft(2, data_seed=7) != sft(1, data_seed=8)
    # default (no --data_seed): the stage's seed splits
    assert prompts(1) == _phase_ids(1, 3) and prompts(2) == _phase_ids(2, 3) != _phase_ids(1, 3)
    assert prompts(7) == a  # --seed 7 alone splits like --data_seed 7


def test_cache_key_holds_the_split_seed(tok, tmp_path):
    cfg = DataConfig(data_output_path=str(tmp_path))
    key = T.cache_key(cfg, tok, "train", 5, 1)
    assert key["seed"] == 5 and "data_seed" not in key["data"]  # the key of runs without the flag
    pinned = T.cache_key(
        DataConfig(data_output_path=str(tmp_path), data_seed=5), tok, "train", 9, 1
    )
    assert pinned == key
    assert T.cache_key(cfg, tok, "train", 6, 1) != key
    moved = DataConfig(data_output_path=str(tmp_path), data_seed=6)
    assert T.cache_key(moved, tok, "train", 5, 1) != key


# --- empty sets: a clear error with counts, nothing cached ----------------------------------------
def _plain_file(tmp_path, n, name="rows.jsonl"):
    f = tmp_path / name
    rows = [
        {"prompt": f"POST\nQuestion {i}.\nTL;DR: ", "chosen": f"a{i}", "rejected": f"b{i}"}
        for i in range(n)
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _empty_error(build, cache):
    """The DataError of ``build`` (raised twice: nothing was cached in between)."""

    def entries():
        return sorted(p.name for p in cache.iterdir()) if cache.exists() else []

    before = entries()
    with pytest.raises(DataError) as first:
        build()
    assert entries() == before, "an empty set was cached"
    with pytest.raises(DataError) as second:
        build()
    assert str(second.value) == str(first.value)
    return str(first.value)


def test_empty_phase_of_the_split(tok, tmp_path):
    cache = tmp_path / "cache"
    cfg = DataConfig(data_output_path=str(cache), data_split="0,5,5", max_samples=40)
    msg = _empty_error(lambda: T.build_sft_dataset(cfg, tok, "train", 1), cache)
    assert msg.startswith("no train SFT examples for phase 1 (SFT)")
    assert (
        "--data_path synthetic-tldr: 2200 rows read from" in msg and "synthetic_tldr.jsonl" in msg
    )
    assert "40 examples (--max_samples); 0 in phase 1 (--data_split 0,5,5)" in msg
    assert "phase 1 (SFT) has weight 0 in --data_split 0,5,5" in msg
    rm = DataConfig(data_output_path=str(cache), data_split="5,0,5", max_samples=40)
    msg = _empty_error(lambda: T.build_pair_dataset(rm, tok, "train", 1), cache)
    assert "no train preference pairs for phase 2 (reward-model)" in msg
    assert "phase 2 (reward-model) has weight 0 in --data_split 5,0,5" in msg


def test_empty_sets_of_tiny_files(tok, tmp_path):
    cache = tmp_path / "cache"
    one = _plain_file(tmp_path, 1, "one.jsonl")
    cfg = DataConfig(data_path=(str(one),), data_output_path=str(cache))
    msg = _empty_error(lambda: T.build_sft_dataset(cfg, tok, "train", 1), cache)
    assert f"--data_path {one}: 1 rows read; 1 in the train split (95/5 carve); 1 examples" in msg
    assert "phase 1's share of 1 examples under --data_split 2,4,4 rounds to 0" in msg
    five = _plain_file(tmp_path, 5, "five.jsonl")
    cfg = DataConfig(data_path=(str(five),), data_output_path=str(cache))
    assert len(T.build_sft_dataset(cfg, tok, "train", 1)) == 1  # round(5 * 0.2) = 1
    msg = _empty_error(lambda: T.build_sft_dataset(cfg, tok, "eval", 1), cache)
    assert "no eval SFT examples" in msg and "5 rows read; 0 in the eval split (95/5 carve)" in msg
    assert "needs at least 11 rows" in msg
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cfg = DataConfig(data_path=(str(empty),), data_output_path=str(cache / "e"))
    assert "the data has no rows" in _empty_error(
        lambda: T.build_sft_dataset(cfg, tok, "train", 1), cache / "e"
    )


def test_every_prompt_over_long(tok, tmp_path):
    cache = tmp_path / "cache"
    cfg = DataConfig(
        data_path=(str(_plain_file(tmp_path, 5)),), data_output_path=str(cache), data_split="0,0,1"
    )
    msg = _empty_error(lambda: T.build_prompt_dataset(cfg, tok, "train", 1, 4), cache)
    assert "no train PPO prompts for phase 3 (PPO)" in msg and "5 in phase 3" in msg
    assert "dropped while building: 5 prompts longer than --max_prompt_seq_len 4" in msg
    assert "raise --max_prompt_seq_len, or pass --overlong_prompts truncate" in msg
    ds, n = T.build_prompt_dataset(cfg, tok, "train", 1, 4, overlong="truncate_left")
    assert len(ds) == 5 and n == 5  # truncated prompts are counted too


# --- prompts cut to --max_seq_len are counted and logged ------------------------------------------
def test_prompt_cut_to_max_seq_len_is_counted_and_warned(tok, data_file, tmp_path, caplog):
    full = [len(ids(tok, r["prompt"])) for r in ROWS]
    for _ in range(2):  # the build, then a cache hit: both warn
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="marlhf.data.tokenize"):
            ds = T.build_sft_dataset(cfg_for(data_file, tmp_path, max_seq_len=12), tok, "train", 0)
        kept = [sum(lab == -100 for lab in r["labels"]) - 1 for r in ds]  # prompt tokens, no bos
        assert max(kept) < min(full)  # both prompts lost their start
        assert (
            "train SFT examples (phase 1): 2 of 2 prompts cut from the left to fit "
            "--max_seq_len 12" in caplog.text
        )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marlhf.data.tokenize"):
        T.build_pair_dataset(
            cfg_for(data_file, tmp_path, data_split="0,1,0", max_seq_len=12), tok, "train", 0
        )
        T.build_sft_dataset(cfg_for(data_file, tmp_path, max_seq_len=512), tok, "train", 0)
    assert "train preference pairs (phase 2): 2 of 2 prompts cut from the left" in caplog.text
    assert "SFT examples" not in caplog.text  # everything fits in 512 tokens: no warning


# --- a pair with no preference is dropped and counted ---------------------------------------------
def test_identical_pairs_are_dropped_and_counted(tok, tmp_path, caplog):
    rows = [dict(r) for r in ROWS] + [
        {"prompt": "POST\nSame.\nTL;DR: ", "chosen": "my dog", "rejected": "my dog"},
        # the same first five words: identical once cut to the budget below
        {
            "prompt": "Q: ",
            "chosen": "my dog ate my lunch twice",
            "rejected": "my dog ate my lunch again",
        },
    ]
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="marlhf.data.tokenize"):
        ds = T.build_pair_dataset(cfg_for(f, tmp_path, data_split="0,1,0"), tok, "train", 0)
    assert len(ds) == 3 and all(r["chosen_input_ids"] != r["rejected_input_ids"] for r in ds)
    assert (
        "train preference pairs (phase 2): 1 dropped: pairs with chosen == rejected" in caplog.text
    )
    # budget: bos + the whole (short) prompt + the shared start; fit() keeps a prompt of at most
    # half the budget whole, so the responses keep exactly their shared start
    p = len(ids(tok, rows[3]["prompt"]))
    shared = len(ids(tok, "my dog ate my lunch"))
    assert ids(tok, rows[3]["chosen"])[:shared] == ids(tok, rows[3]["rejected"])[:shared]
    assert shared >= p
    budget = 1 + p + shared
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marlhf.data.tokenize"):
        cut = T.build_pair_dataset(
            cfg_for(f, tmp_path, data_split="0,1,0", max_seq_len=budget), tok, "train", 0
        )
    assert f"pairs identical once cut to --max_seq_len {budget}" in caplog.text
    assert all(r["chosen_input_ids"] != r["rejected_input_ids"] for r in cut)
    one = tmp_path / "same.jsonl"
    one.write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(DataError, match=r"dropped while building: 1 pairs with chosen == rejected"):
        T.build_pair_dataset(cfg_for(one, tmp_path, data_split="0,1,0"), tok, "train", 0)


# --- --end_of_conversation_token must be one token ------------------------------------------------
def test_end_of_conversation_token_must_be_one_token(tok_nobos, data_file, tmp_path):
    cfg = cfg_for(data_file, tmp_path, end_of_conversation_token="<|endoftext|>")
    pieces = tok_nobos.convert_ids_to_tokens(ids(tok_nobos, "<|endoftext|>"))
    assert len(pieces) > 1
    for build in (
        lambda: T.build_sft_dataset(cfg, tok_nobos, "train", 0),
        lambda: T.build_prompt_dataset(cfg, tok_nobos, "train", 0, 64),  # before PPO's eos ids
    ):
        with pytest.raises(ValueError) as err:
            build()
        msg = str(err.value)
        assert msg.startswith("--end_of_conversation_token '<|endoftext|>' is not one token of")
        assert f"it encodes to {len(pieces)} tokens {pieces}" in msg and "'<eos>'" in msg
    assert not (tmp_path / "cache").exists()
    tok_nobos.name_or_path = "my/model"
    with pytest.raises(ValueError, match="the tokenizer of 'my/model'"):
        T.eot_ids(cfg, tok_nobos)
