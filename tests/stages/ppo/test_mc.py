"""macro_mc's Monte-Carlo values (marlhf.stages.ppo.mc): the continuations, their budget, their rewards, and
that they depend neither on the split of the rows nor on the size of the generate calls.

The end-to-end check draws real continuations with the embedded pretrained model and the static
decoder, and recomputes every value independently: one `marlhf.models.decode.sample` call per continuation
with its own seed, the response cut by hand, scored by a one-row reward-model forward (or the gold
scorer on the decoded text), clipped, with the no-EOS penalty, averaged in plain Python.
"""

import doctest
import statistics
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import marlhf.stages.ppo.mc as mc
from marlhf.algo.estimators import MCBoundaries
from marlhf.stages.ppo.rollout import Rollout
from tests.support.generation_checks import Engine

PROMPTS = [
    "POST\nSubreddit: r/family\nLast week, my sister borrowed my car. Sorry for the long post.\nTL;DR: ",
    "POST\nSubreddit: r/jobs\nMy boss cancelled our trip. I found out that my coworker lost the keys.\nTL;DR: ",
    "POST\nSubreddit: r/pets\nMy dog ate my homework.\nTL;DR: ",
    "POST\nSubreddit: r/work\nMy manager moved the meeting and my team missed the bus.\nTL;DR: ",
]


def test_doctests():
    assert doctest.testmod(mc).failed == 0


def test_jobs_keys_and_means():
    b = MCBoundaries(
        torch.tensor([[2, 5], [-1, -1], [3, -1]]),
        torch.tensor([[1, 1], [0, 0], [1, 0]]).bool(),
        torch.tensor([[1, 2], [-1, -1], [1, -1]]),
    )
    jobs = mc.continuation_jobs(b, K=2, with_prompt=True)
    assert jobs.row.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert jobs.slot.tolist() == [0, 0, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1]
    assert jobs.prefix.tolist() == [0, 0, 2, 2, 5, 5, 0, 0, 0, 0, 3, 3]
    assert jobs.k.tolist() == [0, 1] * 6
    # keys: unique, and a row's keys depend on its global row only
    keys = mc.job_keys(jobs, torch.tensor([10, 4, 7]), max_boundaries=2, K=2)
    assert len(set(keys.tolist())) == 12
    alone = mc.continuation_jobs(
        MCBoundaries(b.positions[2:], b.mask[2:], b.macro_index[2:]), K=2, with_prompt=True
    )
    assert mc.job_keys(alone, torch.tensor([7]), 2, 2).tolist() == keys[8:].tolist()
    # no boundary in any row (one macro action each): only the prompts, or nothing
    none = MCBoundaries(*(torch.zeros(2, 0, dtype=t) for t in (torch.long, torch.bool, torch.long)))
    only = mc.continuation_jobs(none, K=2, with_prompt=True)
    assert only.row.tolist() == [0, 0, 1, 1] and only.prefix.tolist() == [0] * 4
    assert mc.continuation_jobs(none, K=2, with_prompt=False).row.numel() == 0
    rewards = torch.arange(12, dtype=torch.float64)
    values, prompt = mc.mc_means(rewards, jobs, B=3, N=2)
    assert values.tolist() == [[2.5, 4.5], [0.0, 0.0], [10.5, 0.0]]
    assert prompt.tolist() == [0.5, 6.5, 8.5]


def test_a_continuation_is_cut_to_the_rest_of_the_length_budget():
    """Row 0: prefix 2 of response [5 6 7], budget 6 - 2 = 4: continuation [8 9 2(EOS)] fits (ends);
    row 1: prefix 4, budget 2: continuation [8 9 2] is cut after 2 tokens (its EOS falls out)."""
    pad = 0
    ro = Rollout(
        sequences=torch.tensor([[40, 41, 5, 6, 7, 0, 0], [42, 5, 6, 7, 8, 9, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]]).bool(),
        response_start=torch.tensor([2, 1]),
        response_ids=torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]),
        action_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool(),
        ends_with_eos=torch.tensor([False, False]),
        prompt_ids=["a", "b"],
    )
    rows, prefix = torch.tensor([0, 1]), torch.tensor([2, 4])
    batch = mc.prefix_batch(ro, rows, prefix, pad)
    assert batch["input_ids"].tolist() == [[0, 40, 41, 5, 6], [42, 5, 6, 7, 8]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    cont = Rollout(
        sequences=torch.zeros(2, 1, dtype=torch.long),
        attention_mask=torch.ones(2, 1).bool(),
        response_start=torch.zeros(2, dtype=torch.long),
        response_ids=torch.tensor([[8, 9, 2], [8, 9, 2]]),
        action_mask=torch.ones(2, 3).bool(),
        ends_with_eos=torch.tensor([True, True]),
        prompt_ids=["a", "b"],
    )
    full = mc.continued_rollout(ro, rows, prefix, cont, max_len=6, pad_id=pad)
    assert full.response_ids.tolist() == [[5, 6, 8, 9, 2, 0], [5, 6, 7, 8, 8, 9]]
    assert full.action_mask.sum(1).tolist() == [5, 6]
    assert full.ends_with_eos.tolist() == [True, False]
    assert full.response_start.tolist() == [2, 1]
    assert full.sequences.tolist() == [[40, 41, 5, 6, 8, 9, 2], [42, 5, 6, 7, 8, 8, 9]]


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.models.reward_model import RewardModel
    from marlhf.models.zoo import BASE_DIR

    tok = AutoTokenizer.from_pretrained(BASE_DIR, padding_side="left")
    actor = AutoModelForCausalLM.from_pretrained(BASE_DIR, dtype=torch.float32)
    torch.manual_seed(0)
    reward = RewardModel.from_pretrained(str(BASE_DIR), init_std=0.05).eval()
    return tok, Engine(actor), Engine(reward)


def _run(setup, reward_source="rm", **ppo):
    from marlhf.data.synthetic import gold_score
    from marlhf.models.generation import SamplerSetup, open_sampler
    from marlhf.stages.ppo.config import (
        ActorCriticConfig,
        GenerationConfig,
        PPOConfig,
        PPOStageConfig,
        ppo_optim,
    )
    from marlhf.stages.ppo.scoring import SequenceReward

    tok, actor, reward = setup
    cfg = PPOStageConfig(
        models=ActorCriticConfig(reward_model_name_or_path="rm"),
        generation=GenerationConfig(
            max_prompt_seq_len=64, max_answer_seq_len=10, temperature=1.0, top_k=0,
            generation_backend="static", per_device_generation_batch_size=4,
        ),
        ppo=PPOConfig(
            advantage_estimator="macro_mc", reward_source=reward_source, reward_clip=5.0,
            no_eos_penalty=-0.25, optim=ppo_optim(seed=7), **ppo,
        ),
    )  # fmt: skip
    sampler = open_sampler("static", cfg.generation, SamplerSetup(model=actor.module))
    models = SimpleNamespace(
        actor=actor, reward=reward if reward_source == "rm" else None, sampler=sampler
    )
    oracle = gold_score if reward_source == "gold" else None
    return SimpleNamespace(
        cfg=cfg, models=models, tokenizer=tok, eos_ids=[tok.eos_token_id], gold=gold_score,
        reward=SequenceReward(tok, cfg.ppo, oracle=oracle),
    )  # fmt: skip


def _monte_carlo(run, step, exp, rows, metas, texts):
    """The loop's call of :func:`mc.monte_carlo` with the run's parts."""
    ctx = mc.Continuations(
        run.models, run.cfg.ppo, run.cfg.generation, run.tokenizer, run.eos_ids, run.reward, step
    )
    return mc.monte_carlo(ctx, exp, rows, metas, texts)


def _experience(run, rows):
    """A rollout of PROMPTS[rows] (static decoder, seeds of their global rows) as experience with
    fixed 3-token macro actions."""
    from marlhf.macro import MacroConfig, build_termination
    from marlhf.runtime.rows import derive_row_seeds
    from marlhf.stages.ppo.experience import segment, token_rewards
    from marlhf.stages.ppo.rollout import generate
    from marlhf.stages.ppo.scoring import Scored

    tok = run.tokenizer
    batch = tok([PROMPTS[i] for i in rows], return_tensors="pt", padding=True)
    batch = {**batch, "prompt_id": [str(i) for i in rows]}
    seeds = derive_row_seeds(run.cfg.ppo.optim.seed, 0, torch.tensor(rows), stream=2)
    ro = generate(
        run.models.actor,
        run.models.sampler,
        batch,
        run.cfg.generation,
        tok,
        run.eos_ids,
        row_seeds=seeds,
    )
    A = ro.response_ids.shape[1]
    zeros = torch.zeros(len(rows), A)
    scored = Scored(old_logprobs=zeros, entropy=zeros, ref_logprobs=zeros, values=zeros)
    term = segment(
        build_termination(MacroConfig(termination_condition="fixed", ngram=3)), ro, scored
    )
    return token_rewards(ro, scored, torch.zeros(len(rows)), term, run.cfg.ppo, 0.0)


def _reference_value(run, exp, b, global_row, slot, position, step):
    """V̂ of (row b, slot) recomputed one continuation at a time."""
    from marlhf.models.decode import sample
    from marlhf.runtime.rows import derive_row_seeds

    tok, g, ppo = run.tokenizer, run.cfg.generation, run.cfg.ppo
    ro = exp.rollout
    start = int(ro.response_start[b])
    state = ro.sequences[b, : start + position][None, :]
    rewards = []
    for k in range(ppo.mc_rollouts):
        key = (global_row * (ppo.mc_max_boundaries + 1) + slot) * ppo.mc_rollouts + k
        seed = derive_row_seeds(ppo.optim.seed, step, torch.tensor([key]), stream=3)
        cont = sample(
            run.models.actor.module, state, torch.ones_like(state),
            max_new_tokens=g.max_answer_seq_len - position, temperature=g.temperature,
            top_k=g.top_k, top_p=g.top_p, eos_ids=run.eos_ids, pad_id=tok.pad_token_id,
            row_seeds=seed, prompt_bucket=g.max_prompt_seq_len,
        )[0].tolist()  # fmt: skip
        ends = tok.eos_token_id in cont
        cont = cont[: cont.index(tok.eos_token_id) + 1] if ends else cont
        response = ro.response_ids[b, :position].tolist() + cont
        assert len(response) <= g.max_answer_seq_len
        if ppo.reward_source == "rm":
            ids = torch.tensor([ro.sequences[b, :start].tolist() + response])
            with torch.no_grad():
                score = float(run.models.reward.module(ids, torch.ones_like(ids))[0, -1])
        else:
            text = tok.decode(response, skip_special_tokens=True)
            score = run.gold(PROMPTS[global_row], text)
        score = max(-5.0, min(5.0, score)) + (0.0 if ends else -0.25)
        rewards.append(score)
    return statistics.fmean(rewards)


@pytest.mark.parametrize("reward_source", ["rm", "gold"])
def test_values_are_the_mean_rewards_of_independently_drawn_continuations(setup, reward_source):
    run = _run(setup, reward_source, mc_rollouts=3, mc_max_boundaries=2)
    rows = [0, 1, 2, 3]
    exp = _experience(run, rows)
    exp, stats = _monte_carlo(run, 5, exp, torch.tensor(rows), [{}] * 4, PROMPTS)
    pos = exp.mc_positions
    n_boundaries = int((pos >= 0).sum())
    assert n_boundaries > 0
    assert len(set(exp.mc_values[pos >= 0].tolist())) > n_boundaries // 2  # not all clipped
    assert stats["mc/continuations"] == 3 * (n_boundaries + 4)  # + the prompt (G = 1)
    for b in rows:
        want = _reference_value(run, exp, b, b, 0, 0, step=5)
        assert float(exp.mc_prompt_values[b]) == pytest.approx(want, abs=1e-5)
        for n, p in enumerate(pos[b].tolist()):
            if p >= 0:
                want = _reference_value(run, exp, b, b, n + 1, p, step=5)
                assert float(exp.mc_values[b, n]) == pytest.approx(want, abs=1e-5), (b, n)


def test_values_do_not_depend_on_the_split_or_the_call_size(setup):
    run = _run(setup, mc_rollouts=2, mc_max_boundaries=3, n_samples_per_prompt=2)
    rows = [0, 1, 2, 3]
    whole, _ = _monte_carlo(run, 1, _experience(run, rows), torch.tensor(rows), [{}] * 4, PROMPTS)
    assert whole.mc_prompt_values is None  # G = 2: the group's leave-one-out mean instead
    # rows 2 and 3 alone (another rank's share), drawn one continuation per generate call
    run.cfg = replace(run.cfg, ppo=replace(run.cfg.ppo, mc_generation_batch_size=1))
    part = _experience(run, [2, 3])
    part, stats = _monte_carlo(run, 1, part, torch.tensor([2, 3]), [{}] * 2, PROMPTS[2:])
    n = part.mc_positions.shape[1]
    assert torch.equal(part.mc_positions, whole.mc_positions[2:, :n])
    valid = part.mc_positions >= 0
    torch.testing.assert_close(
        part.mc_values[valid], whole.mc_values[2:, :n][valid], atol=1e-5, rtol=0
    )
    assert stats["mc/continuations"] == 2 * int(valid.sum())
    # another step draws other continuations
    other, _ = _monte_carlo(run, 2, _experience(run, rows), torch.tensor(rows), [{}] * 4, PROMPTS)
    assert not torch.equal(other.mc_values, whole.mc_values)
