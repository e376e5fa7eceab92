"""A reward server (``--reward_url http://host:port/path``): the rows are POSTed to it as JSON and
it answers one reward per row.

Request (``Content-Type: application/json``), one per ``--reward_batch_size`` rows::

    {"prompts": ["...", ...], "completions": ["...", ...], "<column>": [...], ...}

with the rows' other dataset columns as lists, as a ``--reward_fn`` function gets them
(:mod:`marlhf.rewards.functions`). Answer (status 200)::

    {"rewards": [0.5, null, ...]}

one int, float or null per row, in the request's order (null: no reward from the server for that
row). Up to ``--reward_concurrency`` requests are in flight at once; the rewards keep the rows'
order whatever order the answers arrive in. A request that fails to connect, times out
(``--reward_timeout_s``) or gets status 429 or 5xx is retried up to ``--reward_retries`` times,
waiting 0.5 s, 1 s, 2 s, ... between tries; one that still fails, any other status, or an answer
that is not such JSON stops the run with one ``error:`` line naming the URL and the rows (the
values are checked like a function's: :func:`marlhf.rewards.terms.check_values`).
``scripts/reward_server.py`` is a reference server.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from marlhf.rewards.terms import RewardBatch, RewardError, RewardTerm, check_values

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RemoteReward:
    """The reward server at ``url`` as a reward term (``reward/server``).

    ``batch_size`` rows per request, at most ``concurrency`` requests at once, each given
    ``timeout_s`` seconds and retried ``retries`` times after ``backoff_s * 2**k`` seconds."""

    url: str
    weight: float = 1.0
    batch_size: int = 32
    concurrency: int = 4
    timeout_s: float = 60.0
    retries: int = 3
    backoff_s: float = 0.5
    errors: str = "raise"

    def __call__(self, batch: RewardBatch) -> list[RewardTerm]:
        raw = self.rewards(batch)
        values, scored, n_errors = check_values(f"--reward_url {self.url}", raw, batch, self.errors)
        return [RewardTerm("server", values, scored, self.weight, errors=n_errors)]

    def rewards(self, batch: RewardBatch) -> list[Any]:
        """The server's value for each row of ``batch``, in row order."""
        columns = batch.columns()
        n = len(batch)
        chunks = [(lo, min(lo + self.batch_size, n)) for lo in range(0, n, self.batch_size)]
        if not chunks:
            return []
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(chunks)))
        try:
            futures = [
                pool.submit(self._post, _payload(batch, columns, lo, hi), lo, hi)
                for lo, hi in chunks
            ]
            out: list[Any] = []
            for f in futures:  # in the rows' order, whichever answer came first
                out.extend(f.result())
            return out
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _post(self, payload: dict, lo: int, hi: int) -> list[Any]:
        """POST ``payload`` (rows ``lo`` to ``hi - 1``) with retries; the ``rewards`` list."""
        body = json.dumps(payload).encode("utf-8")
        rows = f"rows {lo}-{hi - 1} of the batch"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(
                self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    text = response.read()
            except urllib.error.HTTPError as e:
                detail = e.read()[:200].decode("utf-8", "replace").strip()
                last = f"HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")
                if e.code in RETRY_STATUSES:
                    continue
                raise RewardError(f"--reward_url {self.url} answered {last} for {rows}") from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                reason = getattr(e, "reason", e)
                if isinstance(e, socket.timeout) or isinstance(reason, socket.timeout):
                    reason = f"no answer within --reward_timeout_s {self.timeout_s:g}"
                last = f"{type(e).__name__}: {reason}"
                continue
            return _answer(text, self.url, rows, hi - lo)
        raise RewardError(
            f"--reward_url {self.url}: no answer for {rows} after {self.retries + 1} tries "
            f"(last: {last}); is the server running?"
        )


def _payload(batch: RewardBatch, columns: dict[str, list], lo: int, hi: int) -> dict:
    """The request's JSON body for rows ``lo`` to ``hi - 1``."""
    body = {"prompts": batch.prompts[lo:hi], "completions": batch.completions[lo:hi]}
    for name, values in columns.items():
        body.setdefault(name, values[lo:hi])  # a column named like the two keeps theirs
    return body


def _answer(text: bytes, url: str, rows: str, n: int) -> list[Any]:
    """The ``rewards`` list of an answer (RewardError naming ``url`` when it is not one of ``n``)."""
    try:
        answer = json.loads(text)
    except ValueError:
        shown = text[:80].decode("utf-8", "replace")
        raise RewardError(
            f"--reward_url {url}: the answer for {rows} is not JSON: {shown!r}"
        ) from None
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list):
        raise RewardError(
            f'--reward_url {url}: the answer for {rows} has no "rewards" list: {str(answer)[:80]!r}'
        )
    if len(rewards) != n:
        raise RewardError(
            f"--reward_url {url}: {len(rewards)} rewards answered for {rows} ({n} rows)"
        )
    return rewards
