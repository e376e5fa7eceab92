import datasets

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
