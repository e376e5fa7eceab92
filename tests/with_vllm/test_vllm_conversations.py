"""Multi-turn conversations on the vLLM backend, sampled as multi-turn PPO samples them
(``sample_turns``, through tests/support/turns.py): sent whole at every turn, the engine's prefix
cache serves what it has read; continuing them that way gives the tokens and log-probs of
re-reading them with the cache emptied before every turn, the recorded
log-probs are the trainer's forward pass over the finished conversation, and a row's episode
depends on its seed only. On the shipped ``tiny-base-trail`` with the trail task's prompts, float32
on CPU, KV-cache blocks of 32 tokens (the CPU default). Runs where vLLM is installed (``make test-vllm``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm)")

from marlhf.data import trail  # noqa: E402
from marlhf.models.config import VLLMConfig  # noqa: E402
from marlhf.models.conversation import ChatLayout  # noqa: E402
from marlhf.models.generation import SamplerSetup, SamplingConfig, open_sampler  # noqa: E402
from marlhf.models.logprobs import token_logprobs  # noqa: E402
from tests.support.turns import TurnPlayer  # noqa: E402

pytestmark = pytest.mark.slow

T = 1.0
MAX_LEN = 200
LOGPROB_TOL = 5e-5  # the engine's recorded log-probs against the trainer's (test_vllm_engine.py)
ANSWERS = [  # the environment's fixed answers after turns 1, 2, 3
    [{"role": "user", "content": "my boss: call my cousin."}],
    [{"role": "user", "content": "my cousin: call my uncle."}],
    [{"role": "user", "content": "my uncle: I do not know."}],
]
ROWS = [[0, 1, 2, 3], [0, 1, 2, 3], [0, 2, 3], [3, 0]]  # who plays each turn


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.models.load import resolve_model_path

    path = resolve_model_path("tiny-base-trail")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = SamplingConfig(
        max_prompt_seq_len=MAX_LEN, max_answer_seq_len=10, temperature=T, top_k=0,
        generation_backend="vllm", vllm=VLLMConfig(),  # CPU blocks of 32 by default
    )  # fmt: skip
    sampler = open_sampler("vllm", cfg, SamplerSetup(model_path=path, max_rows=4))
    yield path, tok, model, cfg, sampler
    sampler.close()


def _play(sampler, layout, cfg, prompts, seeds, rows_per_turn=ROWS, reread=False):
    """Play the turns with the trail template's contexts after each action; returns the
    turns' actions, the conversations and each turn's contexts."""
    engine = sampler.engine
    engine.llm.reset_prefix_cache()
    conv = TurnPlayer(sampler, [layout.prompt(p) for p in prompts], seeds, MAX_LEN)
    messages = [list(p) for p in prompts]
    turns, last, contexts = [], {}, []
    for k, rows in enumerate(rows_per_turn):
        ctx = []
        for r in rows:
            if k == 0:
                ctx.append([])
                continue
            ids, ended = last[r]
            text = layout.tokenizer.decode(ids[:-1] if ended else ids)
            ctx.append(layout.context(messages[r], text, ANSWERS[k - 1], ended, k))
            messages[r] += [{"role": "assistant", "content": text}, *ANSWERS[k - 1]]
        if reread:
            engine.llm.reset_prefix_cache()
        t = conv.sample_turn(rows, ctx, cfg, [layout.end_of_turn], layout.tokenizer.pad_token_id)
        for r, ids, ended in zip(rows, t.action_ids, t.ends_with_eos, strict=True):
            last[r] = (ids, ended)
        turns.append(t)
        contexts.append(ctx)
    return turns, conv, contexts


def test_continuing_gives_the_tokens_and_logprobs_of_rereading(setup):
    """The prefix cache serves most of each turn's prompt; the tokens are those of the same
    conversations re-read with the cache emptied before every turn, and every action token's
    recorded log-prob is the trainer's forward pass over the row's finished conversation."""
    path, tok, model, cfg, sampler = setup
    layout = ChatLayout(tok)
    prompts = [r["prompt"] for r in trail.rows(4, 4, seed=0, split="valid")]
    seeds = torch.tensor([5, 6, 7, 8])
    engine = sampler.engine
    assert not sampler.continues_conversations  # sent whole: the prefix cache serves them
    engine.prefix_tokens.update(prompt=0, cached=0)
    cont, conv, contexts = _play(sampler, layout, cfg, prompts, seeds)
    hits = dict(engine.prefix_tokens)
    engine.prefix_tokens.update(prompt=0, cached=0)
    again, conv2, _ = _play(sampler, layout, cfg, prompts, seeds, reread=True)
    assert engine.prefix_tokens["cached"] == 0 < hits["cached"]
    assert hits["cached"] > 0.4 * hits["prompt"]  # blocks of 32: most of each prompt served
    for x, y in zip(cont, again, strict=True):
        assert x.action_ids == y.action_ids
        for p, q in zip(x.logprobs, y.logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=0, atol=LOGPROB_TOL)
    # the trainer's log-probs of the actions, one forward pass per finished conversation
    worst, n = 0.0, 0
    for r in range(4):
        full = conv.conversation(r)
        assert full == conv2.conversation(r)
        ids = torch.tensor([full])
        with torch.no_grad():
            ref = token_logprobs(model(input_ids=ids).logits[:, :-1] / T, ids[:, 1:])[0]
        at = len(layout.prompt(prompts[r]))
        for k, t in enumerate(cont):
            if r not in ROWS[k]:
                break
            i = ROWS[k].index(r)
            action = t.action_ids[i]
            at += len(contexts[k][i])
            assert full[at : at + len(action)] == action
            got = torch.tensor(t.logprobs[i])
            worst = max(worst, float((got - ref[at - 1 : at - 1 + len(action)]).abs().max()))
            n += len(action)
            at += len(action)
        assert at == len(full)
    assert n > 30 and worst < LOGPROB_TOL


def test_an_episode_depends_on_its_seed_only(setup):
    path, tok, model, cfg, sampler = setup
    layout = ChatLayout(tok)
    prompts = [r["prompt"] for r in trail.rows(4, 4, seed=1, split="valid")]
    seeds = torch.tensor([15, 16, 17, 18])
    batch, _, _ = _play(sampler, layout, cfg, prompts, seeds)
    alone, _, _ = _play(sampler, layout, cfg, prompts[3:], seeds[3:], [[0]] * len(ROWS))
    assert [t.action_ids[ROWS[k].index(3)] for k, t in enumerate(batch)] == [
        t.action_ids[0] for t in alone
    ]
