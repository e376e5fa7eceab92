"""Tests for marlhf.rewards.remote against scripts/reward_server.py (started on a free port): the
answers arrive in row order under concurrency and retries, a server that stays down or answers
wrongly is one error naming the URL."""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from marlhf.rewards.remote import RemoteReward
from marlhf.rewards.terms import RewardBatch, RewardError
from marlhf.runtime.distributed import free_port

SERVER = Path(__file__).resolve().parents[2] / "scripts" / "reward_server.py"


@pytest.fixture()
def serve():
    """``serve(*flags)``: the reference server on a free port; returns its URL."""
    procs = []

    def start(*flags):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", str(port), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout.readline().startswith("listening on"), proc.stderr.read()
        url = f"http://127.0.0.1:{port}"
        for _ in range(50):  # the socket listens once the line is printed; be safe anyway
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        return f"{url}/score"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _batch(n):
    # the answer of row i is "i"; the completions hold it for every third row
    return RewardBatch(
        prompts=[f"p{i}" for i in range(n)],
        completions=[f"it is {i}" if i % 3 == 0 else "no idea" for i in range(n)],
        metas=[{"columns": {"answer": str(i)}} for i in range(n)],
    )


def test_answers_keep_the_rows_order_under_concurrency_and_retries(serve):
    url = serve("--fail_first", "3", "--max_delay_s", "0.05")
    n = 23
    client = RemoteReward(url, batch_size=2, concurrency=4, retries=3, backoff_s=0.01)
    raw = client.rewards(_batch(n))
    # independent expectation: row i contains its own answer exactly when i % 3 == 0
    # ("it is 12" contains "1" and "2" but row 12's answer is "12"; "no idea" contains no digit)
    assert raw == [1.0 if i % 3 == 0 else 0.0 for i in range(n)]
    (term,) = client(_batch(n))
    assert term.name == "server" and term.values.tolist() == raw


def test_null_is_no_reward(serve):
    url = serve()
    batch = RewardBatch(["a", "b"], ["x", "y"], [{"columns": {"answer": "x"}}, {}])
    (term,) = RemoteReward(url)(batch)
    assert term.values.tolist() == [1.0, 0.0] and term.scored.tolist() == [True, False]


def test_a_server_that_stays_down_is_one_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/score"  # nothing listens there
    client = RemoteReward(url, retries=2, backoff_s=0.01, timeout_s=2)
    t0 = time.perf_counter()
    with pytest.raises(RewardError) as e:
        client.rewards(_batch(3))
    msg = str(e.value)
    assert msg.startswith(f"--reward_url {url}: no answer for rows 0-2 of the batch after 3 tries")
    assert "Connection refused" in msg or "ConnectionRefused" in msg
    assert time.perf_counter() - t0 < 5


def test_a_failing_server_is_retried_then_named(serve):
    url = serve("--fail_first", "100")
    with pytest.raises(RewardError, match=r"after 2 tries \(last: HTTP 503"):
        RemoteReward(url, retries=1, backoff_s=0.01).rewards(_batch(2))


def test_a_wrong_answer_is_named_and_a_client_error_not_retried():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    answers = iter(
        [
            (200, b'{"rewards": [1.0]}'),
            (200, b'{"score": 1}'),
            (200, b"not json"),
            (200, b'{"rewards": [NaN, 1]}'),
            (400, b'{"error": "no answer column"}'),
        ]
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            status, body = next(answers)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/r"
    client = RemoteReward(url, retries=3, backoff_s=10.0)
    try:
        with pytest.raises(RewardError, match="1 rewards answered for rows 0-1 of the batch"):
            client.rewards(_batch(2))
        with pytest.raises(RewardError, match='has no "rewards" list'):
            client.rewards(_batch(2))
        with pytest.raises(RewardError, match="is not JSON"):
            client.rewards(_batch(2))
        with pytest.raises(RewardError, match=rf"--reward_url {url}, row 0 .*returned nan"):
            client(_batch(2))
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match=r"answered HTTP 400 Bad Request: .*no answer column"):
            client.rewards(_batch(2))
        assert time.perf_counter() - t0 < 5  # not retried: no backoff of 10 s was waited
    finally:
        server.shutdown()
        server.server_close()
