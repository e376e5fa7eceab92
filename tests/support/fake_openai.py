"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions API, with scripted replies.

``script(messages) -> action`` decides each reply from the request; an action is a reply text (200), or
``("status", code[, message])`` for an HTTP error (``{auth}`` in the message is replaced by the
request's Authorization header, to test that errors echoing the key are scrubbed), or ``("slow", seconds, text)``. Every request is recorded
(path, headers, body) so tests can count requests and check what the client sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Action = Any


class FakeOpenAI:
    def __init__(self, script: Callable[[list[dict[str, str]], int], Action]) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake.lock:
                    n = len(fake.requests)
                    fake.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    action = fake.script(body.get("messages", []), n)
                    if isinstance(action, tuple) and action[0] == "slow":
                        time.sleep(action[1])
                        action = action[2]
                    if isinstance(action, tuple) and action[0] == "status":
                        msg = action[2] if len(action) > 2 else f"scripted {action[1]}"
                        msg = msg.replace("{auth}", self.headers.get("Authorization", ""))
                        payload = json.dumps({"error": {"message": msg, "type": "x"}}).encode()
                        self.send_response(action[1])
                    else:
                        if self.path != "/v1/chat/completions":
                            self.send_response(404)
                            payload = b"{}"
                        else:
                            payload = json.dumps(
                                {
                                    "id": f"chatcmpl-{n}",
                                    "object": "chat.completion",
                                    "created": int(time.time()),
                                    "model": body.get("model", "judge"),
                                    "choices": [
                                        {
                                            "index": 0,
                                            "message": {"role": "assistant", "content": action},
                                            "finish_reason": "stop",
                                        }
                                    ],
                                    "usage": {
                                        "prompt_tokens": 100,
                                        "completion_tokens": 10,
                                        "total_tokens": 110,
                                    },
                                }
                            ).encode()
                            self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def shown(messages: list[dict[str, str]], label: str) -> str:
    """The response text shown under ``[... A]`` or ``[... B]`` in a rendered judge prompt."""
    user = messages[-1]["content"]
    for head in ("Summary", "Reply", "Answer"):
        tag = f"[{head} {label}]\n"
        if tag in user:
            rest = user.split(tag, 1)[1]
            return rest.split("\n\n", 1)[0]
    raise AssertionError("no response block in prompt")


def prefer(pred: Callable[[str], bool]) -> Callable[[list[dict[str, str]], int], str]:
    """A judge that picks the position whose response satisfies ``pred`` (tie if both or neither)."""

    def script(messages: list[dict[str, str]], n: int) -> str:
        a, b = pred(shown(messages, "A")), pred(shown(messages, "B"))
        v = "A" if a and not b else "B" if b and not a else "TIE"
        return f"Reason: scripted.\nVerdict: [[{v}]]"

    return script
