"""A reference reward server for ``marlhf ppo --reward_url`` (standard library only).

    python scripts/reward_server.py --port 8000 [--rule contains|length]
    marlhf ppo ... --reward_url http://127.0.0.1:8000/score

It answers every POST (any path) of the protocol in docs/guide/rewards.md: the request is
``{"prompts": [...], "completions": [...], <the rows' other columns as lists>}``, the answer
``{"rewards": [...]}``, one value per row in the request's order. The scoring rules:

- ``contains`` (default): 1.0 when the row's ``answer`` column (as text, stripped) occurs in the
  completion, else 0.0; null (no reward) for a row without an answer;
- ``length``: the completion's length in characters over 100 (any data).

``GET /health`` answers ``{"ok": true}``. ``--fail_first N`` answers the first N requests with status
503 and ``--max_delay_s S`` waits a random time up to S seconds before each answer: a client's
retries and the order of its answers under concurrency can be tested with them. Copy this file to
start your own server: replace :func:`score`.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def score(rule: str, prompts: list[str], completions: list[str], columns: dict) -> list:
    """One reward (float or None) per row."""
    if rule == "length":
        return [len(c) / 100.0 for c in completions]
    answers = columns.get("answer") or [None] * len(completions)
    out: list[float | None] = []
    for completion, answer in zip(completions, answers, strict=True):
        if answer is None or not str(answer).strip():
            out.append(None)
        else:
            out.append(1.0 if str(answer).strip() in completion else 0.0)
    return out


class Handler(BaseHTTPRequestHandler):
    rule = "contains"
    fail_first = 0
    max_delay_s = 0.0
    seen = 0
    lock = threading.Lock()

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        self._send(200 if self.path == "/health" else 404, {"ok": self.path == "/health"})

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        with Handler.lock:
            Handler.seen += 1
            fail = Handler.seen <= self.fail_first
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.max_delay_s:
            time.sleep(random.uniform(0, self.max_delay_s))
        if fail:
            self._send(503, {"error": "failing on purpose (--fail_first)"})
            return
        try:
            request = json.loads(body)
            prompts, completions = request.pop("prompts"), request.pop("completions")
            rewards = score(self.rule, prompts, completions, request)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            self._send(400, {"error": f"{type(e).__name__}: {e}"})
            return
        self._send(200, {"rewards": rewards})

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the http.server name
        pass  # quiet: one line per request would flood a training log


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    parser.add_argument("--rule", choices=("contains", "length"), default="contains")
    parser.add_argument("--fail_first", type=int, default=0)
    parser.add_argument("--max_delay_s", type=float, default=0.0)
    args = parser.parse_args(argv)
    Handler.rule, Handler.fail_first, Handler.max_delay_s = (
        args.rule, args.fail_first, args.max_delay_s,
    )  # fmt: skip
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
