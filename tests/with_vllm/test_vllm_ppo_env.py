"""Multi-turn MA-PPO (``--env``, ``--termination_condition turn``) trained end to end through
``--generation_backend vllm`` on CPU, on the bundled trail environment with ``tiny-base-trail``
(real DeepSpeed, the stage as a subprocess, ``tests/support/vllm_record.py`` recording each weight
sync and each step's conversations). The engine follows the actor (its log-probs, read where each
action sits in the conversation, differ from the trainer's by the update before a sync and agree
after it; those it recorded while sampling each turn are the trainer's π_old); each turn's reward
sits on its last action token and adds up to the step's ``env/return``; the observations lie in
the conversation between the actions, outside the actions the loss reads. Runs where vLLM and
skyrl-gym are installed (``make test-vllm``)."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import AutoTokenizer

from marlhf.data.env_rows import load_env_rows
from marlhf.data.trail import TrailGame, World
from marlhf.models.conversation import ChatLayout
from marlhf.models.load import resolve_model_path
from marlhf.runtime.tracking import read_metrics
from tests.support.stage_env import run_stage

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")
pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (requirements-vllm.txt)")

from tests.with_vllm.test_vllm_ppo import RECORD, TOL, _check_syncs, _syncs  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 3
STEP_REWARD = 0.25
FLAGS = (
    "--actor_model_name_or_path", "tiny-base-trail", "--env", "marlhf-trail-4", "--data_path",
    "marlhf-trail-4:16", "--max_turns", "3", "--env_config", f'{{"step_reward": {STEP_REWARD}}}',
    "--env_timeout_s", "0", "--termination_condition", "turn", "--no_eos_own_macro",
    "--value_function", "start", "--generation_backend", "vllm", "--max_prompt_seq_len", "200",
    "--max_total_seq_len", "200", "--max_answer_seq_len", "8", "--per_device_generation_batch_size",
    "4", "--per_device_training_batch_size", "2", "--actor_learning_rate", "1e-3",
    "--temperature", "1.0", "--top_k", "0", "--disable_progress_bar", "--seed", "7",
    "--max_steps", str(STEPS),
)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm_ppo_env")
    out = base / "out"
    run_stage(
        [sys.executable, str(RECORD), *FLAGS, "--output_dir", str(out)],
        base / "home",
    )
    return out


def test_turn_level_mappo_trains_through_vllm_with_synced_weights(run):
    _check_syncs(run, STEPS)
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:  # the engine's record of every action against the trainer's π_old
        assert r["time/sync"] > 0 and r["env/errors"] == 0.0, r
        assert r["rollout/logprob_diff_max"] < TOL, r
        assert 0 <= r["rollout/k3_kl"] < 1e-8, r
        for lvl in ("token", "macro", "seq", "turn"):  # fp32: ratios within rounding of 1
            lo, hi = r[f"rollout/ratio_min_{lvl}"], r[f"rollout/ratio_max_{lvl}"]
            assert 1 - 1e-3 < lo <= hi < 1 + 1e-3, (lvl, r)
        assert "loss/policy" in r and "loss/value" in r and r["macro/count"] > 0, r
    assert sum(r["env/turns"] for r in rows) > STEPS  # conversations went past a first turn


def test_the_turns_replay_the_game_with_rewards_and_replies_where_they_belong(run):
    """Each step's conversations (the record of its sync) replayed on the game: every turn's
    reward is the game's, on the turn's last action token (0 on the other actions), and the rows'
    sums make the step's ``env/return``; the tokens between two turns' actions are the laid-out
    reply of the game, and ``response_ids`` (the actions the losses read) are the tokens at
    ``action_positions``, so no observation token is among them."""
    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-base-trail"))
    eos = {tok.eos_token_id, ChatLayout(tok).end_of_turn}
    worlds = {r["prompt_id"]: r["extra_info"] for r in load_env_rows(("marlhf-trail-4:16",))}
    rows = read_metrics(run / "metrics.jsonl")
    replies = 0
    for m, sync in zip(rows, _syncs(run), strict=True):
        (t,) = sync["turns"]  # one generation batch per step
        returns = []
        for b, prompt_id in enumerate(t["prompt_ids"]):
            game = TrailGame(World.from_info(worlds[prompt_id]), STEP_REWARD)
            n = int(t["action_mask"][b].sum())
            pos = t["action_positions"][b, :n]
            turn, start = t["turn_index"][b, :n], int(t["response_start"][b])
            seq = t["sequences"][b]
            assert torch.equal(seq[start + pos], t["response_ids"][b, :n])  # actions where they sit
            total = 0.0
            for k in range(1, int(turn.max()) + 1):
                ids = seq[start + pos[turn == k]].tolist()
                body = ids[:-1] if ids[-1] in eos else ids
                reply, reward, done = game.step(tok.decode(body, skip_special_tokens=True))
                end = int((turn == k).nonzero().max())
                assert t["turn_end"][b, :n].nonzero().flatten().tolist()[k - 1] == end
                assert t["turn_rewards"][b, end] == pytest.approx(reward)
                total += reward
                if k < int(turn.max()):  # the observation between this turn and the next
                    gap = seq[start + int(pos[end]) + 1 : start + int(pos[end + 1])]
                    assert reply is not None and reply in tok.decode(gap), (reply, tok.decode(gap))
                    replies += 1
            assert float(t["turn_rewards"][b].sum()) == pytest.approx(total)
            assert int(t["turn_end"][b].sum()) == int(turn.max())
            returns.append(total)
        assert m["env/return"] == pytest.approx(sum(returns) / len(returns), abs=1e-6)
    assert replies > 0
