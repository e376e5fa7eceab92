"""Asynchronous judge requests through the ``openai`` client (any OpenAI-compatible server).

Requests run at temperature 0 with at most ``concurrency`` in flight (an ``asyncio.Semaphore``). Rate
limits (HTTP 429), server errors (5xx), request timeouts and dropped connections are retried with
exponential backoff and full jitter, ``delay = min(max_delay, base_delay * 2**attempt) * U(0.5, 1)``;
after ``max_retries`` retries, or at once for any other error (400, 401, ...), the request fails and
its error is recorded (the caller counts it ``invalid``). The openai client's own retries are switched
off so that this policy is the only one. Replies are written to the cache as they arrive, so an
interrupted run loses at most the requests in flight. A reply taken from the cache reports the tokens
it cost when it was bought, so a re-run's summary still shows the spend behind its verdicts. The API key is never logged and is scrubbed from
recorded error messages. ``openai`` is imported inside :func:`make_client` only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from marlhf.judge.cache import JudgeCache


@dataclass
class RetryPolicy:
    """Retry cap and backoff (seconds). Tests use a tiny ``base_delay``."""

    max_retries: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"--max_retries must be >= 0, got {self.max_retries}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("retry delays must be >= 0")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Backoff before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        return min(self.max_delay, self.base_delay * 2**attempt) * (0.5 + 0.5 * rng.random())


@dataclass
class JudgeRequest:
    """One chat request: ``key`` is its cache key, ``messages`` the chat messages."""

    key: str
    messages: list[dict[str, str]]
    max_tokens: int = 256


@dataclass
class JudgeResult:
    """Outcome of one request: ``reply`` text, or ``error`` after the last attempt."""

    key: str
    reply: str | None = None
    error: str | None = None
    attempts: int = 0
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Usage:
    """Accumulated token usage and request counts of one run. ``prompt_tokens`` and
    ``completion_tokens`` are what this run paid for; ``cached_*`` what the cached replies it used
    cost when an earlier run bought them (from their cache records)."""

    requests: int = 0  # HTTP requests sent, retries included
    cached: int = 0
    failed: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def cost(self, price_input: float | None, price_output: float | None) -> float | None:
        """USD this run spent at the given prices per 1M tokens (None if a price is unknown)."""
        return _usd(self.prompt_tokens, self.completion_tokens, price_input, price_output)

    def cost_cached(self, price_input: float | None, price_output: float | None) -> float | None:
        """USD the cached replies used by this run cost when they were bought (same prices)."""
        return _usd(
            self.cached_prompt_tokens, self.cached_completion_tokens, price_input, price_output
        )


def _usd(tok_in: int, tok_out: int, pin: float | None, pout: float | None) -> float | None:
    if pin is None or pout is None:
        return None
    return (tok_in * pin + tok_out * pout) / 1e6


def make_client(base_url: str | None, api_key: str, timeout: float) -> Any:
    """An ``openai.AsyncOpenAI`` with its own retries off (this module retries)."""
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)


def _classify(err: BaseException) -> tuple[bool, str]:
    """(retryable, short description) of an exception raised by the openai client."""
    import openai

    if isinstance(err, openai.APITimeoutError):
        return True, "timeout"
    if isinstance(err, openai.APIConnectionError):
        return True, "connection error"
    if isinstance(err, openai.APIStatusError):
        code = err.status_code
        return code == 429 or code == 408 or code >= 500, f"HTTP {code}"
    return False, type(err).__name__


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


@dataclass
class _Sender:
    """What sending one request needs (shared by the concurrent tasks of one run)."""

    client: Any
    model: str
    cache: JudgeCache | None
    retry: RetryPolicy
    rng: random.Random
    seed: int | None
    secret: str | None
    usage: Usage
    sem: asyncio.Semaphore
    refresh: frozenset[str]

    async def send(self, req: JudgeRequest) -> JudgeResult:
        """One request with retries (module doc); the reply is cached as soon as it arrives."""
        res = JudgeResult(req.key)
        usage = self.usage
        async with self.sem:
            for attempt in range(self.retry.max_retries + 1):
                res.attempts = attempt + 1
                usage.requests += 1
                try:
                    await self._ask(req, res)
                    return res
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - classified below, never swallowed silently
                    retryable, kind = _classify(err)
                    usage.errors[kind] = usage.errors.get(kind, 0) + 1
                    res.error = _scrub(f"{kind}: {err}", self.secret)[:500]
                    if not retryable or attempt == self.retry.max_retries:
                        break
                    usage.retries += 1
                    await asyncio.sleep(self.retry.delay(attempt, self.rng))
        usage.failed += 1
        return res

    async def _ask(self, req: JudgeRequest, res: JudgeResult) -> None:
        kwargs: dict[str, Any] = {} if self.seed is None else {"seed": self.seed}
        t0 = time.monotonic()
        resp = await self.client.chat.completions.create(
            model=self.model,
            messages=req.messages,
            temperature=0,
            max_tokens=req.max_tokens,
            **kwargs,
        )
        text = resp.choices[0].message.content or ""
        u = getattr(resp, "usage", None)
        res.prompt_tokens = int(getattr(u, "prompt_tokens", 0) or 0)
        res.completion_tokens = int(getattr(u, "completion_tokens", 0) or 0)
        res.reply, res.error = text, None
        self.usage.prompt_tokens += res.prompt_tokens
        self.usage.completion_tokens += res.completion_tokens
        if self.cache is not None:
            record = {
                "reply": text,
                "model": getattr(resp, "model", self.model),
                "prompt_tokens": res.prompt_tokens,
                "completion_tokens": res.completion_tokens,
                "seconds": round(time.monotonic() - t0, 3),
            }
            self.cache.put(req.key, record, replace=req.key in self.refresh)

    def from_cache(self, req: JudgeRequest) -> JudgeResult | None:
        """The cached reply of ``req`` as a result (counted as cached), or None."""
        if self.cache is None or req.key in self.refresh:
            return None
        hit = self.cache.get(req.key)
        if hit is None:
            return None
        res = JudgeResult(
            req.key,
            reply=hit.get("reply"),
            cached=True,
            prompt_tokens=int(hit.get("prompt_tokens", 0) or 0),
            completion_tokens=int(hit.get("completion_tokens", 0) or 0),
        )
        self.usage.cached += 1
        self.usage.cached_prompt_tokens += res.prompt_tokens
        self.usage.cached_completion_tokens += res.completion_tokens
        return res


async def judge_requests(
    requests: Sequence[JudgeRequest],
    *,
    client: Any,
    model: str,
    cache: JudgeCache | None = None,
    concurrency: int = 8,
    retry: RetryPolicy | None = None,
    seed: int | None = None,
    secret: str | None = None,
    on_done: Callable[[JudgeResult], None] | None = None,
    refresh: Collection[str] = (),
) -> tuple[list[JudgeResult], Usage]:
    """Send ``requests`` (cache hits skipped), returning one result per request, in order, and usage.

    Requests sharing a key are sent once. ``secret`` (the API key) is scrubbed from error texts.
    ``refresh`` are keys whose cached reply is ignored: they are asked again and the new reply
    replaces the cached one. ``on_done`` is called after each distinct key completes (e.g. a progress
    bar update); an exception raised from it, or a cancellation, stops the run with completed replies
    already cached.
    """
    if concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    sender = _Sender(
        client,
        model,
        cache,
        retry or RetryPolicy(),
        random.Random(seed),
        seed,
        secret,
        Usage(),
        asyncio.Semaphore(concurrency),
        frozenset(refresh),
    )
    unique: dict[str, JudgeRequest] = {}
    for r in requests:
        unique.setdefault(r.key, r)
    done: dict[str, JudgeResult] = {}

    async def one(req: JudgeRequest) -> None:
        res = sender.from_cache(req)
        done[req.key] = res if res is not None else await sender.send(req)
        if on_done is not None:
            on_done(done[req.key])

    tasks = [asyncio.create_task(one(r)) for r in unique.values()]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [JudgeResult(**{**done[r.key].__dict__}) for r in requests], sender.usage


def run_requests(
    requests: Sequence[JudgeRequest],
    *,
    base_url: str | None,
    api_key: str,
    model: str,
    timeout: float = 60.0,
    **kwargs: Any,
) -> tuple[list[JudgeResult], Usage]:
    """Synchronous wrapper: build the client, run :func:`judge_requests`, close the client."""

    async def main() -> tuple[list[JudgeResult], Usage]:
        client = make_client(base_url, api_key, timeout)
        try:
            return await judge_requests(
                requests, client=client, model=model, secret=api_key, **kwargs
            )
        finally:
            await client.close()

    return asyncio.run(main())
