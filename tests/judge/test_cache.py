import doctest
import json

import marlhf.judge.cache as cache_mod
from marlhf.judge.cache import CACHE_FILE, JudgeCache, cache_key


def test_doctests():
    assert doctest.testmod(cache_mod).failed == 0


def test_key_depends_on_every_component_and_nothing_else():
    base = ["gpt-4o-2024-05-13", "summarize-v1", "post", "s1", "s2", "ab"]
    k = cache_key(*base)
    assert k == cache_key(*base)
    assert len(k) == 64 and all(c in "0123456789abcdef" for c in k)
    for i in range(len(base)):
        changed = list(base)
        changed[i] = changed[i] + "x"
        assert cache_key(*changed) != k, i
    # swapping the responses is a different request
    assert cache_key(*base[:3], "s2", "s1", "ab") != k
    # no ambiguity from concatenation
    assert cache_key("m", "v", "ab", "c", "d", "ab") != cache_key("m", "v", "a", "bc", "d", "ab")


def test_persistence_first_record_wins_and_torn_line(tmp_path):
    c = JudgeCache(tmp_path)
    c.put("k1", {"reply": "one"})
    c.put("k1", {"reply": "other"})  # no-op
    c.put("k2", {"reply": "two"})
    # simulate a run killed mid-write: a torn final line without newline
    with open(tmp_path / CACHE_FILE, "a") as fh:
        fh.write('{"key": "k3", "reply": "tor')
    c2 = JudgeCache(tmp_path)
    assert c2.torn_lines == 1
    assert c2.get("k1")["reply"] == "one" and c2.get("k2")["reply"] == "two"
    assert "k3" not in c2 and len(c2) == 2
    c2.put("k3", {"reply": "three"})  # must start on a fresh line
    c3 = JudgeCache(tmp_path)
    assert c3.get("k3")["reply"] == "three" and len(c3) == 3
    lines = (tmp_path / CACHE_FILE).read_text().splitlines()
    assert json.loads(lines[-1])["key"] == "k3"


def test_two_writers_append_safely(tmp_path):
    a, b = JudgeCache(tmp_path), JudgeCache(tmp_path)
    for i in range(20):
        (a if i % 2 else b).put(f"k{i}", {"reply": f"r{i}"})
    merged = JudgeCache(tmp_path)
    assert len(merged) == 20 and merged.torn_lines == 0
    assert all(merged.get(f"k{i}")["reply"] == f"r{i}" for i in range(20))
