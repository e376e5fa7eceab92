import logging

import datasets
import pytest

from marlhf.data.cache import cached, key_hash


def test_key_hash_canonical():
    assert key_hash({"a": 1, "b": [1, 2]}) == key_hash({"b": [1, 2], "a": 1})
    assert key_hash({"a": 1}) != key_hash({"a": 2})


def test_hit_and_miss(tmp_path):
    calls = []

    def build(v):
        def f():
            calls.append(v)
            return datasets.Dataset.from_dict({"x": [v, v + 1]})

        return f

    ds = cached(tmp_path, {"k": 1}, build(10))
    assert ds["x"][:] == [10, 11] and calls == [10]
    again = cached(tmp_path, {"k": 1}, build(99))  # same key: loaded, build not called
    assert again["x"][:] == [10, 11] and calls == [10]
    other = cached(tmp_path, {"k": 2}, build(20))  # changed key: rebuilt
    assert other["x"][:] == [20, 21] and calls == [10, 20]
    # No temporary directories are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [key_hash({"k": 1}), key_hash({"k": 2})]
    )


def test_a_hit_reads_the_entry_once(tmp_path, monkeypatch):
    cached(tmp_path, {"k": 1}, lambda: datasets.Dataset.from_dict({"x": [1, 2]}))
    loads = []
    real = datasets.load_from_disk
    monkeypatch.setattr(
        datasets, "load_from_disk", lambda *a, **k: loads.append(a) or real(*a, **k)
    )
    assert cached(tmp_path, {"k": 1}, lambda: 1 / 0)["x"][:] == [1, 2]
    assert len(loads) == 1


def test_empty_set_is_never_cached(tmp_path):
    # An empty set with features loads back (so a cache that saved it would return it); without
    # features it cannot even be loaded. Either way nothing is saved and the error says so.
    feats = datasets.Features({"x": datasets.Value("int32")})
    for empty in (
        datasets.Dataset.from_dict({"x": []}, features=feats),
        datasets.Dataset.from_dict({}),
    ):
        with pytest.raises(ValueError, match="refusing to cache an empty dataset"):
            cached(tmp_path, {"k": 1}, lambda e=empty: e)
    assert list(tmp_path.iterdir()) == []


def test_entry_that_does_not_load_is_rebuilt(tmp_path, caplog):
    # An entry holding an empty phase saved without features: a set that `load_from_disk` fails on
    # (IndexError) on every run.
    datasets.Dataset.from_dict({"input_ids": []}).save_to_disk(str(tmp_path / key_hash({"k": 1})))
    with caplog.at_level(logging.WARNING):
        ds = cached(tmp_path, {"k": 1}, lambda: datasets.Dataset.from_dict({"x": [1, 2]}))
    assert ds["x"][:] == [1, 2] and "does not load or is empty: rebuilding" in caplog.text
    assert cached(tmp_path, {"k": 1}, lambda: 1 / 0)["x"][:] == [1, 2]  # the rebuilt entry is kept


def test_saving_an_entry_shows_no_progress_bar_and_keeps_the_setting(tmp_path, capfd):
    datasets.enable_progress_bars()
    cached(tmp_path, {"k": 1}, lambda: datasets.Dataset.from_dict({"x": list(range(50))}))
    assert "Saving the dataset" not in capfd.readouterr().err
    assert datasets.is_progress_bar_enabled()  # the caller's setting is back
