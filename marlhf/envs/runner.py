"""Multi-turn episodes of a batch of prompt rows on an environment, whatever generates the actions.

Each row gets its own environment, built with ``--env_config`` and the row's other columns as
``extras`` (SkyRL's dataset format: ``prompt`` is the list of messages, ``env_class`` names the
environment and is not passed on; ``reward_spec``, ``extra_info``, ... are; ``max_turns`` is added).
Then, in rounds::

    init(prompt) -> the first messages                        (every row, in parallel)
    repeat:
        rows whose conversation reached --max_total_seq_len end ("length")
        act(active rows, their conversations) -> one action text per row
        step(action) -> observations, reward, done, metadata   (every active row, in parallel)
        done -> the row ends ("done"); its --max_turns-th turn -> it ends ("max_turns")
    get_metrics(), close()                                    (every row, as it ends)

A row that ends waits for the others; it is never stepped again. ``act`` is the policy: phase by
phase the trainer's generation backend, a fake in tests. It sees the rows by their index in the
batch, so it can keep a per-row state (a KV cache that only needs the new tokens).

What an environment returns is checked: ``init`` a ``(messages, info)`` pair, ``step`` a mapping
with ``observations`` (a list of ``{"role": str, "content": str}``), ``reward`` (a finite number,
or None for no reward), ``done`` (a bool) and ``metadata`` (a dict or None); a
``postprocessed_action`` is refused (the action's tokens are what the policy sampled). An exception,
a timeout or a wrong type is an error of that row: with ``--env_errors fail`` the run stops with
one :class:`EnvError` line naming the environment, the row, the turn and the error (after every
environment is closed); with ``zero_reward`` the row's episode ends there, the turn that failed
gets reward 0 (the turns before keep theirs) and the error is counted in ``env/errors``.
"""

from __future__ import annotations

import concurrent.futures
import copy
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import EnvFactory
from marlhf.envs.worker import LocalPool, Outcome, ProcessPool

# act(rows, conversations) -> one action text per row
Act = Callable[[list[int], list[list[dict]]], list[str]]
STOPS = ("done", "max_turns", "length", "error")


class EnvError(RuntimeError):
    """An environment failed under ``--env_errors fail`` (the message is the whole error line)."""


@dataclass
class Turn:
    """One policy turn: the action, what the environment answered, and its reward (None: none)."""

    action: str
    observations: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    metadata: dict = field(default_factory=dict)


@dataclass
class Episode:
    """One row's conversation.

    ``prompt``: the messages ``init`` returned (the first prompt); ``turns``: the policy's turns in
    order; ``stop``: why it ended (``done``, ``max_turns``, ``length`` or ``error``); ``metrics``:
    the environment's ``get_metrics()``; ``error``: the error line (``--env_errors zero_reward``).
    """

    row: int
    prompt: list[dict]
    turns: list[Turn] = field(default_factory=list)
    stop: str = ""
    metrics: dict = field(default_factory=dict)
    error: str | None = None
    info: Any = None

    @property
    def messages(self) -> list[dict]:
        """The whole conversation: the prompt, then each action (as an ``assistant`` message)
        followed by its observations."""
        out = list(self.prompt)
        for t in self.turns:
            out.append({"role": "assistant", "content": t.action})
            out.extend(t.observations)
        return out

    @property
    def rewards(self) -> list[float]:
        """One reward per turn (0.0 where the environment gave none)."""
        return [0.0 if t.reward is None else float(t.reward) for t in self.turns]

    @property
    def done(self) -> bool:
        return self.stop == "done"

    @property
    def truncated(self) -> bool:
        """Ended by a limit (``--max_turns``, ``--max_total_seq_len``) before the environment said
        done."""
        return self.stop in ("max_turns", "length")


def shown(value: Any, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters (an error line quotes what an environment
    returned)."""
    text = repr(value)
    return (text[: width - 3] + "...") if len(text) > width else text


def _type(value: Any) -> str:
    return type(value).__name__


def check_messages(value: Any, what: str) -> list[dict]:
    """``value`` as a list of ``{"role", "content"}`` dicts (ValueError naming ``what`` else)."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} {shown(value)} ({_type(value)}); it must be a list of messages")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise ValueError(f"{what}[{j}] {shown(m)} ({_type(m)}); it must be a dict")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(
                    f"{what}[{j}].{key} {shown(m.get(key))} ({_type(m.get(key))}); "
                    "it must be a string"
                )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _is_bool(value: Any) -> bool:
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ == "bool")


def check_step(out: Any) -> Turn:
    """The :class:`Turn` of a ``step`` output (``action`` left empty); ValueError naming the field
    and its value when a type is wrong."""
    if not isinstance(out, Mapping):
        raise ValueError(f"returned {shown(out)} ({_type(out)}); it must be a dict")
    missing = [k for k in ("observations", "reward", "done") if k not in out]
    if missing:
        raise ValueError(f"returned a dict without {', '.join(missing)}")
    observations = check_messages(out["observations"], "returned observations")
    reward = out["reward"]
    if reward is not None:
        if _is_bool(reward) or not isinstance(reward, numbers.Real):
            raise ValueError(
                f"returned reward {shown(reward)} ({_type(reward)}); it must be a number or None"
            )
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"returned reward {reward}; it must be finite")
    done = out["done"]
    if not _is_bool(done):
        raise ValueError(f"returned done {shown(done)} ({_type(done)}); it must be a bool")
    metadata = out.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValueError(
            f"returned metadata {shown(metadata)} ({_type(metadata)}); it must be a dict or None"
        )
    if out.get("postprocessed_action") is not None:
        raise ValueError(
            "returned a postprocessed_action; it is not supported (the action's tokens are "
            "what the policy sampled)"
        )
    return Turn("", observations, reward, bool(done), dict(metadata or {}))


def check_init(out: Any) -> tuple[list[dict], Any]:
    """``(messages, info)`` of an ``init`` output (ValueError naming what is wrong)."""
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise ValueError(f"returned {shown(out)} ({_type(out)}); it must be (messages, info)")
    messages = check_messages(out[0], "returned messages")
    if not messages:
        raise ValueError("returned no messages")
    return messages, out[1]


def episode_extras(row: Mapping, max_turns: int) -> dict:
    """The ``extras`` of a prompt row's environment: its columns but ``prompt`` and
    ``env_class`` (deep copies: an environment may change them), plus ``max_turns``."""
    extras = {k: copy.deepcopy(v) for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = max_turns
    return extras


def _prompt_of(row: Mapping, i: int) -> list[dict]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    try:
        return check_messages(prompt, "prompt")
    except ValueError as err:
        raise ValueError(f"row {i}: field {err}") from None


def run_episodes(
    factory: EnvFactory,
    rows: Sequence[Mapping],
    act: Act,
    cfg: EnvConfig,
    measure: Callable[[int, list[dict]], int] | None = None,
    row_names: Sequence[str] | None = None,
) -> list[Episode]:
    """The episodes of ``rows`` (prompt rows in SkyRL's format; a plain-text ``prompt`` is one user
    message) on environments of ``factory``, actions from ``act`` (see the module doc).

    Args:
        cfg: ``max_turns``, ``max_total_seq_len``, ``env_timeout_s``, ``env_workers``,
            ``env_errors``.
        measure: ``measure(row, messages)``, the tokens of a conversation with the next generation
            prompt; without it ``--max_total_seq_len`` is not checked here.
        row_names: how errors name the rows (default ``row 0``, ``row 1``, ...).

    Returns:
        one :class:`Episode` per row, in order. Raises :class:`EnvError` (``fail``) or
        ValueError (a row without a valid ``prompt``).
    """
    batch = _Batch(factory, rows, cfg, measure, row_names)
    try:
        batch.play(batch.start(), act)
    finally:
        batch.close()
    return batch.episodes


Future = concurrent.futures.Future


class _Batch:
    """The environments of one batch of rows as :func:`run_episodes` plays them: their pool, the
    episodes, the stepping threads of ``--env_overlap`` and the finish calls not yet read."""

    def __init__(self, factory: EnvFactory, rows, cfg: EnvConfig, measure, row_names) -> None:
        self.factory, self.cfg, self.measure = factory, cfg, measure
        self.names = (
            list(row_names) if row_names is not None else [f"row {i}" for i in range(len(rows))]
        )
        self.prompts = [_prompt_of(r, i) for i, r in enumerate(rows)]
        extras = [episode_extras(r, cfg.max_turns) for r in rows]
        self.pool = (
            ProcessPool(factory, extras, cfg.env_workers, cfg.env_timeout_s)
            if cfg.env_timeout_s > 0
            else LocalPool(factory, extras, cfg.env_workers)
        )
        self.episodes = [Episode(i, p) for i, p in enumerate(self.prompts)]
        self.stepper = (
            concurrent.futures.ThreadPoolExecutor(
                cfg.env_overlap, thread_name_prefix="marlhf-env-step"
            )
            if cfg.env_overlap > 1
            else None
        )
        self.closing: list[tuple[list[int], Future]] = []  # finish calls, in order

    def fail(self, i: int, turn: int, call: str, text: str) -> None:
        where = f"--env {self.factory.name}: {self.names[i]}" + (f", turn {turn}" if turn else "")
        line = f"{where}: {call} {text}"
        if self.cfg.env_errors == "fail":
            raise EnvError(line)
        if self.episodes[i].error is None:  # the first error of a row is the one reported
            self.episodes[i].error, self.episodes[i].stop = line, "error"

    def outcome_text(self, o: Outcome) -> str:
        if o.status == "timeout":
            return f"did not return within --env_timeout_s {self.cfg.env_timeout_s:g} (stopped)"
        return f"raised {o.text}" if o.status == "error" else ""

    def on_envs(self, kind: str, rows: list[int], args: list) -> Future:
        """``pool.call`` on a stepping thread (a thread per group: the groups' calls, on
        different rows, may run at once), or here and now without overlap."""
        if self.stepper is not None:
            return self.stepper.submit(self.pool.call, rows, kind, args)
        done: Future = Future()
        done.set_result(self.pool.call(rows, kind, args))
        return done

    def finish(self, ended: list[int]) -> None:
        """get_metrics and close the environments of ``ended`` (alive ones): the calls go to
        the environments now, their answers are read by :meth:`read_finished`."""
        live = [i for i in ended if self.pool.alive(i)]
        if live:
            self.closing.append((live, self.on_envs("finish", live, [None] * len(live))))

    def read_finished(self, wait: bool) -> None:
        """The answers of the finish calls made so far (in order; ``wait``: all of them, else
        those that have come)."""
        while self.closing and (wait or self.closing[0][1].done()):
            live, future = self.closing.pop(0)
            for i, o in zip(live, future.result(), strict=True):
                self.pool.drop(i)
                ep = self.episodes[i]
                if o.status != "ok":
                    self.fail(i, len(ep.turns), "close", self.outcome_text(o))
                    continue
                problem = o.value["metrics_error"] or o.value["close_error"]
                if problem:
                    call = "get_metrics" if o.value["metrics_error"] else "close"
                    self.fail(i, len(ep.turns), call, f"raised {problem}")
                elif not isinstance(o.value["metrics"], Mapping):
                    m = o.value["metrics"]
                    self.fail(i, len(ep.turns), "get_metrics", f"returned {shown(m)} ({_type(m)})")
                else:
                    ep.metrics = dict(o.value["metrics"])

    def playing(self, rows: list[int]) -> list[int]:
        """``rows`` less those that have stopped (their environments finished), after the
        conversation length check."""
        eps = self.episodes
        ended = [i for i in rows if eps[i].stop]
        if self.measure is not None:
            for i in rows:
                if (
                    not eps[i].stop
                    and self.measure(i, eps[i].messages) >= self.cfg.max_total_seq_len
                ):
                    eps[i].stop = "length"
                    ended.append(i)
        self.finish(ended)
        return [i for i in rows if not eps[i].stop]

    def start(self) -> list[int]:
        """``init`` every row's environment; returns the rows that play."""
        rows_all = list(range(len(self.prompts)))
        for i, o in zip(rows_all, self.pool.call(rows_all, "init", self.prompts), strict=True):
            try:
                if o.status != "ok":
                    self.fail(i, 0, "init", self.outcome_text(o))
                    continue
                self.episodes[i].prompt, self.episodes[i].info = check_init(o.value)
            except ValueError as err:
                self.fail(i, 0, "init", str(err))
        self.finish([i for i in rows_all if self.episodes[i].stop])
        self.read_finished(wait=True)
        return [i for i in rows_all if not self.episodes[i].stop]

    def play(self, active: list[int], act: Act) -> None:
        """The rounds, until every row has stopped. The groups take turns: while the
        environments step one group's actions, the policy samples the next group's (with one
        group: sample every row, then step every row)."""
        eps = self.episodes
        n, k = len(active), min(self.cfg.env_overlap, max(1, len(active)))
        groups = [active[j * n // k : (j + 1) * n // k] for j in range(k)]
        stepping: dict[int, tuple[list[int], list[str], Future]] = {}
        while any(groups) or stepping:
            for j in range(k):
                if j in stepping:
                    acted, actions, future = stepping.pop(j)
                    for i, action, o in zip(acted, actions, future.result(), strict=True):
                        _record_step(
                            eps[i], action, o, self.cfg.max_turns, self.outcome_text, self.fail
                        )
                    groups[j] = acted
                groups[j] = self.playing(groups[j])
                self.read_finished(wait=False)
                if groups[j]:
                    group = groups[j]
                    actions = _checked_actions(
                        act(list(group), [eps[i].messages for i in group]), len(group)
                    )
                    stepping[j] = (group, actions, self.on_envs("step", group, actions))
        self.read_finished(wait=True)

    def close(self) -> None:
        """Wait for the stepping threads, then close every environment still open."""
        if self.stepper is not None:
            self.stepper.shutdown(wait=True, cancel_futures=True)
        self.pool.shutdown()


def _checked_actions(actions: object, n: int) -> list[str]:
    """``act``'s answer for ``n`` rows: a list of ``n`` strings (TypeError naming what it was)."""
    if not isinstance(actions, list | tuple) or len(actions) != n:
        raise TypeError(f"act returned {shown(actions)} for {n} rows")
    bad = [a for a in actions if not isinstance(a, str)]
    if bad:
        raise TypeError(f"act returned {shown(bad[0])} ({_type(bad[0])}), not a string")
    return list(actions)


def _record_step(
    ep: Episode,
    action: str,
    o: Outcome,
    max_turns: int,
    outcome_text: Callable[[Outcome], str],
    fail: Callable[[int, int, str, str], None],
) -> None:
    """Add the turn of ``action`` to ``ep`` from the environment's answer ``o``, and whether the
    episode stops there (``done``, or ``--max_turns`` reached); a bad answer is ``fail``ed."""
    k = len(ep.turns) + 1
    try:
        if o.status != "ok":
            raise ValueError(outcome_text(o))
        turn = check_step(o.value)
    except ValueError as err:
        ep.turns.append(Turn(action, reward=0.0))
        fail(ep.row, k, "step", str(err))
        return
    turn.action = action
    ep.turns.append(turn)
    if turn.done:
        ep.stop = "done"
    elif k >= max_turns:
        ep.stop = "max_turns"


def episode_metrics(episodes: Sequence[Episode], factory: EnvFactory) -> dict[str, float]:
    """``env/*`` scalars of a batch: ``errors`` (how many rows failed), the means of ``turns``,
    ``return`` (the sum of a row's rewards) and ``done``, the shares of rows stopped by
    ``--max_turns`` and ``--max_total_seq_len``, and the environment class's
    ``aggregate_metrics`` of the rows' ``get_metrics()`` (rows without an error) as ``env/<key>``."""
    n = max(len(episodes), 1)
    out = {
        "env/errors": float(sum(e.stop == "error" for e in episodes)),
        "env/turns": sum(len(e.turns) for e in episodes) / n,
        "env/return": sum(sum(e.rewards) for e in episodes) / n,
        "env/done": sum(e.done for e in episodes) / n,
        "env/stopped_max_turns": sum(e.stop == "max_turns" for e in episodes) / n,
        "env/stopped_length": sum(e.stop == "length" for e in episodes) / n,
    }
    metrics = [e.metrics for e in episodes if e.stop != "error"]
    for key, value in factory.aggregate_metrics(metrics).items():
        if isinstance(value, numbers.Real) and f"env/{key}" not in out:
            out[f"env/{key}"] = float(value)
    return out
