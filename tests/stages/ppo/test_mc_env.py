"""macro_mc with --env (marlhf.stages.ppo.mc_env): the Monte-Carlo value at a turn boundary is the
mean return of continuations whose first turns replay the episode's (the same actions, the same
observations, the conversation's tokens up to the boundary unchanged) and whose return is the sum
of the rewards the environment gives its actions, recomputed here by stepping a fresh environment
and by the environment's own formula, plus the reward model's score of the continued
conversation (clipped, with the no-EOS penalty) with --reward_source rm; an environment that answers a replayed step otherwise is
refused in one line naming it, the row and the turn; and the stage trains with it end to end."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from marlhf.data.env_rows import load_env_rows
from marlhf.envs.config import EnvConfig
from marlhf.envs.replay import ReplayError
from marlhf.envs.runner import episode_extras
from marlhf.macro import MacroConfig, build_termination
from marlhf.models.conversation import ChatLayout
from marlhf.models.generation import SamplerSetup, open_sampler
from marlhf.models.reward_model import RewardModel
from marlhf.models.zoo import ensure_trail_base
from marlhf.runtime.rows import derive_row_seeds
from marlhf.runtime.tracking import read_metrics
from marlhf.stages.ppo.config import GenerationConfig, PPOConfig, ppo_optim
from marlhf.stages.ppo.experience import segment, token_rewards
from marlhf.stages.ppo.mc import Continuations
from marlhf.stages.ppo.mc_env import env_monte_carlo, play_continuations
from marlhf.stages.ppo.multiturn import Played, env_setup, play
from marlhf.stages.ppo.scoring import Scored, SequenceReward
from tests.support.fake_envs import Tally, tally_reward
from tests.support.forked import run_python
from tests.support.generation_checks import Engine, end_score
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[3]
FAKES = ROOT / "tests" / "support" / "fake_envs.py"
K, C, SEED, STEP, CLIP, PENALTY = 2, 2, 7, 3, 1.0, -0.25


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_trail_base()
    tok = AutoTokenizer.from_pretrained(path)
    return tok, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _rows(tmp_path: Path, n: int = 3) -> list[dict]:
    path = tmp_path / "rows.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "prompt": f"count {i}", "turns": 3}) + "\n")
    return load_env_rows((str(path),))


def _setup(model, env_class: str, rows: list[dict], reward_source: str = "none"):
    """The episodes of ``rows`` on ``env_class`` (static decoder, the step's row seeds) as
    experience with one macro action per turn, and the continuations' context (with
    ``reward_source`` rm, a reward model: the trail base with a fresh value head)."""
    tok, module = model
    g = GenerationConfig(
        max_answer_seq_len=6, temperature=1.0, top_k=0, generation_backend="static",
        per_device_generation_batch_size=2,
    )  # fmt: skip
    ppo = PPOConfig(
        advantage_estimator="macro_mc", reward_source=reward_source, mc_rollouts=K,
        mc_max_boundaries=C, mc_boundary_selection="spread", no_eos_penalty=PENALTY,
        reward_clip=CLIP, optim=ppo_optim(seed=SEED),
    )  # fmt: skip
    env = env_setup(
        EnvConfig(env=f"{FAKES}:{env_class}", env_timeout_s=0, max_total_seq_len=256, max_turns=4),
        tok,
    )
    actor = Engine(module)
    sampler = open_sampler("static", g, SamplerSetup(model=module))
    eos = [tok.eos_token_id]
    seeds = derive_row_seeds(SEED, STEP, torch.arange(len(rows)), stream=2)
    ro, episodes = play(env, actor, sampler, rows, g, eos, tok.pad_token_id, seeds)
    A = ro.response_ids.shape[1]
    zeros = torch.zeros(len(rows), A)
    scored = Scored(old_logprobs=zeros, entropy=zeros, ref_logprobs=zeros, values=zeros)
    term = segment(build_termination(MacroConfig(termination_condition="turn")), ro, scored)
    exp = token_rewards(ro, scored, torch.zeros(len(rows)), term, ppo, 0.0)
    rm = None
    if reward_source == "rm":
        torch.manual_seed(0)
        rm = Engine(RewardModel.from_pretrained(str(ensure_trail_base()), init_std=0.05))
    models = SimpleNamespace(actor=actor, reward=rm, sampler=sampler)
    ctx = Continuations(models, ppo, g, tok, eos, SequenceReward(tok, ppo), step=STEP)
    return ctx, env, exp, Played(rows, episodes)


@pytest.mark.parametrize("reward_source", ["none", "rm"])
def test_a_boundarys_value_is_the_mean_return_of_replayed_then_sampled_episodes(
    model, tmp_path, reward_source
):
    tok = model[0]
    ends = {tok.eos_token_id, ChatLayout(tok).end_of_turn}
    rows = _rows(tmp_path)
    ctx, env, exp, played = _setup(model, "Tally", rows, reward_source)
    ro = exp.rollout
    out, stats = env_monte_carlo(ctx, env, exp, torch.arange(len(rows)), played)
    assert all(len(e.turns) == 3 for e in played.episodes)  # done after three turns each
    pos = out.mc_positions
    assert int((pos >= 0).sum()) == 2 * len(rows)  # the starts of turns 2 and 3 (C = 2)
    assert stats["mc/continuations"] == K * (int((pos >= 0).sum()) + len(rows))  # + prompts
    resampled = cut = 0
    scored = set()
    for b, row in enumerate(rows):
        recorded = played.episodes[b]
        start = int(ro.response_start[b])
        slots = [(0, 0, start)]  # the prompt: no turn before it
        for n, p in enumerate(pos[b].tolist()):
            if p >= 0:  # the boundary before action token p: the turns that ended before it
                turns = int(ro.turn_end[b, :p].sum())
                slots.append((n + 1, turns, start + int(ro.action_positions[b, p])))
        for slot, turns, state_len in slots:
            returns = []
            for k in range(K):
                key = torch.tensor([(b * (C + 1) + slot) * K + k])
                full, (ep,) = play_continuations(ctx, env, played, ro, [b], [turns], key)
                # the replayed turns: the recorded actions, answered as they were
                assert [t.action for t in ep.turns[:turns]] == [
                    t.action for t in recorded.turns[:turns]
                ]
                assert [t.observations for t in ep.turns[:turns]] == [
                    t.observations for t in recorded.turns[:turns]
                ]
                # the state continued from is the recorded conversation up to the boundary
                assert (
                    full.sequences[0, :state_len].tolist() == ro.sequences[b, :state_len].tolist()
                )
                resampled += [t.action for t in ep.turns[turns:]] != [
                    t.action for t in recorded.turns[turns:]
                ]
                # the return: a fresh environment stepped here with the episode's actions
                fresh = Tally(extras=episode_extras(row, 4))
                fresh.init([{"role": "user", "content": row["prompt"]}])
                total = 0.0
                for t, turn in enumerate(ep.turns, start=1):
                    answer = fresh.step(turn.action)
                    assert answer["observations"] == turn.observations
                    assert answer["reward"] == tally_reward(t, len(turn.action))
                    total += answer["reward"]
                assert answer["done"] and len(ep.turns) == 3
                # the sequence reward: the reward model's score of the whole conversation at its
                # last action token, clipped, and the penalty for an action cut before its end
                ids = full.sequences[0, : int(full.attention_mask[0].sum())].tolist()
                score = 0.0
                if reward_source == "rm":
                    score = max(-CLIP, min(CLIP, end_score(ctx.models.reward.module, ids)))
                    scored.add(score)
                cut += ids[-1] not in ends
                returns.append(total + score + (0.0 if ids[-1] in ends else PENALTY))
            want = statistics.fmean(returns)
            got = out.mc_prompt_values[b] if slot == 0 else out.mc_values[b, slot - 1]
            assert float(got) == pytest.approx(want, abs=1e-5), (b, slot)
    assert resampled > 0  # the continuations draw their own turns after the boundary
    assert cut > 0  # some last actions were cut (the penalty is exercised)
    if reward_source == "rm":  # the scores differ and are not all clipped
        assert len(scored) > 3 and any(abs(x) < CLIP for x in scored)


def test_an_environment_that_answers_a_replay_otherwise_is_refused(model, tmp_path):
    rows = _rows(tmp_path, 2)
    ctx, env, exp, played = _setup(model, "Unreplayable", rows)
    with pytest.raises(ReplayError) as err:
        env_monte_carlo(ctx, env, exp, torch.arange(2), played)
    line = str(err.value)
    assert "\n" not in line
    assert re.match(
        rf"--env {re.escape(str(FAKES))}:Unreplayable: prompt row r\d, turn 1: replaying .*"
        r"observations .* not deterministic, so --advantage_estimator macro_mc cannot replay it"
        r".*\(use gae, grpo",
        line,
    ), line


# the stage as a process (tiny-base-trail on CPU)
COMMON = [
    "--actor_model_name_or_path", "tiny-base-trail", "--max_answer_seq_len", "8",
    "--per_device_training_batch_size", "2", "--disable_progress_bar", "--temperature", "1.0",
    "--top_k", "0", "--max_total_seq_len", "256", "--env_timeout_s", "0",
    "--per_device_generation_batch_size", "2", "--advantage_estimator", "macro_mc",
    "--mc_rollouts", "2", "--mc_max_boundaries", "2", "--mc_boundary_selection", "spread",
    "--termination_condition", "turn",
]  # fmt: skip


def _stage(out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "marlhf.stages.ppo", *COMMON, "--output_dir", str(out), *flags]
    return run_python(cmd, env=stage_env(), capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_the_stage_trains_with_macro_mc_on_the_trail_task(tmp_path):
    proc = _stage(
        tmp_path / "run", "--env", "marlhf-trail-4", "--data_path", "marlhf-trail-4:8",
        "--max_turns", "4", "--max_steps", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(metrics) == 2
    for m in metrics:
        for key in ("loss/policy", "policy/entropy", "objective/score", "mc/boundaries"):
            assert key in m and torch.isfinite(torch.tensor(m[key])), key
        # two rows a step: K continuations at each boundary and at each prompt (G = 1)
        assert m["mc/continuations"] == 2 * (2 * m["mc/boundaries"] + 2)
    assert sum(m["mc/boundaries"] for m in metrics) > 0


@pytest.mark.slow
def test_the_stage_refuses_an_environment_it_cannot_replay_in_one_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"id": i, "prompt": "count", "turns": 3}) + "\n" for i in "ab")
    )
    flags = ["--env", f"{FAKES}:Unreplayable", "--data_path", str(path), "--max_steps", "1",
             "--max_turns", "4"]  # fmt: skip
    proc = _stage(tmp_path / "run", *flags)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert re.search(
        rf"error: --env {re.escape(str(FAKES))}:Unreplayable: prompt row [ab], turn 1: .*"
        r"not deterministic, so --advantage_estimator macro_mc cannot replay it",
        line,
    ), line
