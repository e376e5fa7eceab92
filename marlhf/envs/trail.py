"""The skyrl-gym environment of the bundled trail task (:mod:`marlhf.data.trail`), registered as
``marlhf-trail-{2,4,8}`` (:func:`marlhf.envs.loading.register_bundled`).

It subclasses skyrl-gym's ``BaseTextEnv``, so this module imports skyrl-gym when it is imported;
nothing imports it by name but skyrl-gym's registry (and the tests), so the package's light paths
never pay for it. It runs unchanged under SkyRL (``skyrl_gym.make("marlhf-trail-4", ...)``).
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from marlhf.data.trail import TrailGame, World, parse_action


class TrailEnv(BaseTextEnv):
    """One game of the trail task. ``extras["extra_info"]`` holds the world (:func:`rows` writes
    it); ``turns`` (registered per id) must be its turns; ``env_config.step_reward`` (default 0)
    is the reward of each call answered with a name. Its metrics: ``gold`` (the final reward alone,
    1 or 0: the task's gold score, also with a per-turn reward), ``first_call_key`` and
    ``turns``."""

    def __init__(
        self, env_config: Any = None, extras: dict | None = None, turns: int | None = None
    ):
        super().__init__()
        extras = extras or {}
        if "extra_info" not in extras:
            raise ValueError("the trail environment needs the row's extra_info (its world)")
        world = World.from_info(extras["extra_info"])
        if turns is not None and world.turns != turns:
            raise ValueError(
                f"the row is a game of {world.turns} turns, the environment plays {turns} "
                f"(use marlhf-trail-{world.turns})"
            )
        step_reward = 0.0
        if env_config is not None and env_config.get("step_reward") is not None:
            step_reward = float(env_config.get("step_reward"))
        self.world = world
        self.game = TrailGame(world, step_reward)
        self.max_turns = world.turns
        self.first_call: str | None = None
        self.gold = 0.0

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reply, reward, done = self.game.step(action)
        self.turns = self.game.turn
        if self.turns == 1:
            kind, person = parse_action(action)
            self.first_call = person if kind == "call" else None
        if done:
            self.gold = reward  # the final reward has no per-turn part
        observations = [] if reply is None else [{"role": "user", "content": reply}]
        return BaseTextEnvStepOutput(
            observations=observations, reward=reward, done=done, metadata={}
        )

    def get_metrics(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "gold": self.gold,
            "first_call_key": float(self.first_call == self.world.key),
        }
