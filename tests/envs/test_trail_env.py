"""The bundled trail task's environment under skyrl-gym's own ``make`` (as SkyRL builds it) and
under the runner, against the game of marlhf.data.trail played by hand."""

from __future__ import annotations

import pytest

from marlhf.data import trail
from marlhf.envs.config import EnvConfig
from marlhf.envs.loading import load_env, register_bundled
from marlhf.envs.runner import episode_metrics, run_episodes


def test_skyrl_gym_makes_the_registered_ids():
    import skyrl_gym
    from omegaconf import DictConfig

    register_bundled()
    register_bundled()  # twice is harmless
    row = trail.rows(4, 1, seed=3)[0]
    world = trail.World.from_info(row["extra_info"])
    env = skyrl_gym.make(
        "marlhf-trail-4",
        env_config=DictConfig({"step_reward": 0.25}),
        extras={k: v for k, v in row.items() if k not in ("prompt", "env_class")},
    )
    prompt, _ = env.init(row["prompt"])
    assert prompt == row["prompt"]
    out = env.step(trail.call_text(world.key))
    assert out["observations"] == [
        {"role": "user", "content": f"my {world.key}: call my {world.trails[world.key][0]}."}
    ]
    assert (out["reward"], out["done"]) == (0.25, False)
    with pytest.raises(ValueError, match="the row is a game of 4 turns, the environment plays 8"):
        skyrl_gym.make("marlhf-trail-8", env_config=DictConfig({}), extras=row)


def test_the_runner_plays_the_right_and_a_wrong_first_call():
    rows = trail.rows(8, 6, seed=4)
    worlds = [trail.World.from_info(r["extra_info"]) for r in rows]
    firsts = [
        w.key if i % 2 == 0 else next(c for c in w.candidates if c != w.key)
        for i, w in enumerate(worlds)
    ]
    scripts = [trail.play(w, f) for w, f in zip(worlds, firsts, strict=True)]

    def act(ids, conversations):
        return [scripts[i][len(c)]["content"] for i, c in zip(ids, conversations, strict=True)]

    factory = load_env("marlhf-trail-8")
    episodes = run_episodes(factory, rows, act, EnvConfig(env="marlhf-trail-8", env_timeout_s=0))
    for i, e in enumerate(episodes):
        assert e.messages == scripts[i]  # the environment answers as the played game
        assert e.rewards == [0.0] * 7 + [1.0 if i % 2 == 0 else 0.0] and e.stop == "done"
        assert e.rewards[-1] == trail.gold(worlds[i], e.messages)
    m = episode_metrics(episodes, factory)
    assert m["env/first_call_key"] == 0.5 and m["env/return"] == 0.5 == m["env/gold"]
    # with a per-turn reward the return grows, the gold (the final reward alone) does not
    paid = load_env("marlhf-trail-8", '{"step_reward": 0.1}')
    episodes = run_episodes(paid, rows, act, EnvConfig(env="marlhf-trail-8", env_timeout_s=0))
    m = episode_metrics(episodes, paid)
    assert m["env/gold"] == 0.5 and m["env/return"] == pytest.approx(0.5 + 7 * 0.1)  # 7 calls
