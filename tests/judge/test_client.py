"""The async judge client against a real local HTTP server through the real openai client."""

import random

import pytest

from marlhf.judge.cache import JudgeCache
from marlhf.judge.client import JudgeRequest, RetryPolicy, run_requests
from tests.support.fake_openai import FakeOpenAI

FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.01)
OK = "Reason: r\nVerdict: [[A]]"


def reqs(n):
    return [JudgeRequest(f"k{i}", [{"role": "user", "content": f"item {i}"}], 16) for i in range(n)]


def item_of(messages):
    return int(messages[-1]["content"].split()[-1])


def run(srv, requests, **kw):
    kw.setdefault("retry", FAST)
    return run_requests(
        requests, base_url=srv.base_url, api_key="sk-secret-777", model="judge-x", **kw
    )


def test_retry_on_429_then_success_and_usage():
    seen = {}

    def script(messages, n):
        i = item_of(messages)
        seen[i] = seen.get(i, 0) + 1
        return ("status", 429) if seen[i] == 1 else OK

    with FakeOpenAI(script) as srv:
        results, usage = run(srv, reqs(3))
    assert [r.reply for r in results] == [OK] * 3
    assert [r.attempts for r in results] == [2, 2, 2]
    assert usage.requests == 6 and usage.retries == 3 and usage.failed == 0
    assert usage.prompt_tokens == 300 and usage.completion_tokens == 30  # 3 successes x (100, 10)
    assert usage.errors == {"HTTP 429": 3}
    body = srv.requests[0]["body"]
    assert body["temperature"] == 0 and body["model"] == "judge-x"


def test_5xx_exhausts_retry_cap_and_records_error():
    with FakeOpenAI(lambda m, n: ("status", 500)) as srv:
        results, usage = run(srv, reqs(1), retry=RetryPolicy(max_retries=2, base_delay=0.001))
    assert results[0].reply is None and "HTTP 500" in results[0].error
    assert results[0].attempts == 3 and len(srv.requests) == 3  # 1 try + 2 retries
    assert usage.failed == 1


def test_client_errors_are_not_retried_and_key_is_scrubbed():
    with FakeOpenAI(lambda m, n: ("status", 401, "bad key {auth}")) as srv:
        results, _ = run(srv, reqs(1))
    assert len(srv.requests) == 1
    assert srv.requests[0]["headers"]["authorization"] == "Bearer sk-secret-777"
    assert "HTTP 401" in results[0].error and "sk-secret-777" not in results[0].error


def test_timeout_is_retried():
    def script(messages, n):
        return ("slow", 1.0, OK) if n == 0 else OK

    with FakeOpenAI(script) as srv:
        results, usage = run(srv, reqs(1), timeout=0.3)
    assert results[0].reply == OK and results[0].attempts == 2
    assert usage.errors == {"timeout": 1}


def test_concurrency_is_bounded():
    with FakeOpenAI(lambda m, n: ("slow", 0.05, OK)) as srv:
        results, _ = run(srv, reqs(8), concurrency=2)
    assert all(r.reply == OK for r in results)
    assert srv.max_in_flight <= 2


def test_duplicate_keys_sent_once_and_cache_hit(tmp_path):
    cache = JudgeCache(tmp_path)
    requests = reqs(3) + reqs(1)  # k0 twice
    with FakeOpenAI(lambda m, n: f"Verdict: [[{'AB'[item_of(m) % 2]}]]") as srv:
        r1, u1 = run(srv, requests, cache=cache)
        assert len(srv.requests) == 3
        r2, u2 = run(srv, requests, cache=JudgeCache(tmp_path))
        assert len(srv.requests) == 3  # nothing new
    assert [r.reply for r in r1] == [r.reply for r in r2]
    assert r1[0].reply == r1[3].reply == "Verdict: [[A]]"
    assert u2.cached == 3 and u2.requests == 0 and all(r.cached for r in r2)


def test_interrupted_run_keeps_completed_replies(tmp_path):
    class Stop(Exception):
        pass

    done = []

    def on_done(res):
        done.append(res)
        if len(done) == 3:
            raise Stop

    with FakeOpenAI(lambda m, n: OK) as srv:
        with pytest.raises(Stop):
            run(srv, reqs(6), cache=JudgeCache(tmp_path), concurrency=1, on_done=on_done)
        n_before = len(srv.requests)
        assert len(JudgeCache(tmp_path)) == 3
        results, usage = run(srv, reqs(6), cache=JudgeCache(tmp_path))
        assert len(srv.requests) - n_before == 3  # only the unfinished ones
    assert usage.cached == 3 and all(r.reply == OK for r in results)


def test_backoff_is_exponential_with_jitter():
    p = RetryPolicy(max_retries=5, base_delay=1.0, max_delay=5.0)
    rng = random.Random(0)
    for attempt, cap in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 5.0), (6, 5.0)]:
        d = p.delay(attempt, rng)
        assert cap / 2 <= d <= cap
    with pytest.raises(ValueError, match="--max_retries"):
        RetryPolicy(max_retries=-1)
