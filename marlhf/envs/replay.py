"""Replaying an episode's beginning by re-running its steps: a fresh environment of the row (the
same prompt, ``--env_config`` and extras) is given ``init`` and the recorded actions of its first
turns again (:class:`marlhf.envs.turns.TurnSampler` with ``replay``), and each re-run step must
answer what it answered when the episode was played: the same observations, reward and done (and
``init`` the same first messages). An environment that answers otherwise is not deterministic and
cannot be replayed: :func:`check_replay` raises :class:`ReplayError`, one line naming the
environment, the row and the turn.

Replaying by re-running the steps, rather than copying an environment at the boundary, works for
any environment whose steps depend only on its row and the actions (nothing to pickle, no live
state in worker processes to copy), at the cost of re-running the steps of the prefix.
"""

from __future__ import annotations

from marlhf.envs.runner import EnvError, Episode, shown

ALTERNATIVES = "gae, grpo, dr_grpo, rloo, reinforce_pp or mt_grpo"


class ReplayError(EnvError):
    """An environment answered a replayed step otherwise than when the episode was played (the
    message is the whole error line)."""


def replay_mismatch(recorded: Episode, replayed: Episode, turns: int) -> tuple[int, str] | None:
    """The first difference between the beginning of ``recorded`` and ``replayed``, the same row's
    episode whose first ``turns`` turns replayed ``recorded``'s actions: ``(turn, what)``, turn 0
    for ``init``'s first messages, 1, 2, ... for the policy's turns; None when ``init`` and each of
    the ``turns`` steps answered the same observations, reward and done.

    >>> from marlhf.envs.runner import Turn
    >>> a = Episode(0, [{"role": "user", "content": "hi"}], [Turn("go", [], 1.0), Turn("on")])
    >>> b = Episode(0, [{"role": "user", "content": "hi"}], [Turn("go", [], 0.5)])
    >>> replay_mismatch(a, b, 1)
    (1, 'reward 0.5 where it was 1.0')
    """
    if replayed.prompt != recorded.prompt:
        was = shown(recorded.prompt, 60)
        return 0, f"first messages {shown(replayed.prompt, 60)} where they were {was}"
    for j in range(turns):
        was = recorded.turns[j]
        if j >= len(replayed.turns):
            why = replayed.error or f"it stopped ({replayed.stop})"
            return j + 1, f"no answer: {why}"
        now = replayed.turns[j]
        if replayed.error is not None and j == len(replayed.turns) - 1:
            return j + 1, f"an error: {replayed.error}"
        for name in ("observations", "reward", "done"):
            a, b = getattr(now, name), getattr(was, name)
            if a != b:
                were = "they were" if name == "observations" else "it was"
                return j + 1, f"{name} {shown(a, 60)} where {were} {shown(b, 60)}"
    return None


def check_replay(env: str, row: str, recorded: Episode, replayed: Episode, turns: int) -> None:
    """:class:`ReplayError` when ``replayed`` (an episode of the row named ``row`` whose first
    ``turns`` turns replayed ``recorded``'s) differs from ``recorded`` (:func:`replay_mismatch`):
    the environment ``--env env`` is not deterministic."""
    found = replay_mismatch(recorded, replayed, turns)
    if found is None:
        return
    turn, what = found
    where = "init" if turn == 0 else f"turn {turn}"
    raise ReplayError(
        f"--env {env}: {row}, {where}: replaying the episode's recorded actions, the environment "
        f"answered {what}: it is not deterministic, so --advantage_estimator macro_mc cannot "
        f"replay it to continue from a turn boundary (use {ALTERNATIVES})"
    )
