"""Conversations continued turn by turn by the static backend (``StaticBackend.sample_turn`` on
marlhf.models.continuation), called as multi-turn PPO calls it (``sample_turns``, through
tests/support/turns.py): continuing a conversation from the KV cache gives the tokens and log-probs
of re-reading it from its start every turn through the static decoder's ``sample``; the recorded
log-probs and entropies are those of one forward pass over the finished conversation; a row's
episode depends on its seed only; the cache compacts and grows without changing a token; a call
the cache does not match (a row it dropped, an action cut short) re-reads the conversations."""

from __future__ import annotations

import pytest
import torch
from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

from marlhf.models.continuation import ContinuedDecoder
from marlhf.models.decode import sample
from marlhf.models.generation import (
    Conversations,
    SamplerSetup,
    SamplingConfig,
    backend_info,
    open_sampler,
)
from marlhf.models.generation.sampling import left_pad, sample_responses, sample_turns
from marlhf.models.logprobs import entropy_from_logits, token_logprobs
from marlhf.runtime.rows import turn_seeds
from tests.support.turns import TurnPlayer

PAD = 0
EOS = [1, 5, 9, 13]  # several stop tokens: rows stop after a few tokens, at different steps
V = 64


def _model(arch: str):
    torch.manual_seed(0)
    common = dict(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=PAD,
        eos_token_id=1, bos_token_id=2, initializer_range=0.2,
    )  # fmt: skip
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return GemmaForCausalLM(GemmaConfig(**common, tie_word_embeddings=False)).eval()


def _cfg(top_k: int = 0, top_p: float = 1.0, new: int = 8) -> SamplingConfig:
    return SamplingConfig(
        max_answer_seq_len=new, temperature=0.9, top_k=top_k, top_p=top_p,
        generation_backend="static",
    )  # fmt: skip


def _tokens(lengths, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, V, (n,), generator=g).tolist() for n in lengths]


PROMPT_LENGTHS = (5, 11, 3, 8)
# the rows playing each turn (a row left out has ended) and the lengths of the contexts after the
# previous turn's actions (an environment's observations and the next generation prompt)
SCHEDULE = [
    ([0, 1, 2, 3], None),
    ([0, 1, 2, 3], (2, 6, 1, 3)),
    ([0, 1, 3], (4, 1, None, 7)),
    ([3, 0], (1, None, None, 2)),
]


def _context(row: int, turn: int, n: int) -> list[int]:
    """The fixed context of ``row`` before ``turn`` (what a simulated environment answers)."""
    return _tokens([n], 100 * turn + row)[0]


def _play(conv, cfg, schedule=SCHEDULE, names=None, eos=EOS):
    """Play ``schedule`` on ``conv``; ``names[r]``: the row whose contexts session row ``r`` gets
    (default itself). Returns each turn's actions (tests/support/turns.py)."""
    names = names or {}
    turns = []
    for k, (rows, lengths) in enumerate(schedule):
        ctx = [
            [] if lengths is None else _context(names.get(r, r), k, lengths[names.get(r, r)])
            for r in rows
        ]
        turns.append(conv.sample_turn(rows, ctx, cfg, eos, PAD))
    return turns


def _opened(model, cfg, replay: bool, prompts=None, seeds=None, max_len: int = 120):
    sampler = open_sampler("static", cfg, SamplerSetup(model=model))
    prompts = _tokens(PROMPT_LENGTHS, 1) if prompts is None else prompts
    seeds = torch.arange(len(prompts)) + 31 if seeds is None else seeds
    return TurnPlayer(sampler, prompts, seeds, max_len, reread=replay)


@pytest.mark.parametrize("arch", ["llama", "gemma"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (5, 0.9)])
def test_continuing_gives_the_tokens_and_logprobs_of_rereading(arch, top_k, top_p):
    """Rows of different prompt and context lengths, stopping at different steps and leaving at
    different turns: the KV cache continued turn by turn against re-reading every conversation
    from its start through the static decoder's ``sample``, with the same seeds."""
    model, cfg = _model(arch), _cfg(top_k, top_p)
    cont = _opened(model, cfg, replay=False)
    again = _opened(model, cfg, replay=True)
    a, b = _play(cont, cfg), _play(again, cfg)
    assert len(_decoders(cont.sampler)) == 1 and _decoders(again.sampler) == []
    lengths = set()
    for x, y in zip(a, b, strict=True):
        assert x.action_ids == y.action_ids and x.ends_with_eos == y.ends_with_eos
        for name in ("logprobs", "entropy"):
            for p, q in zip(getattr(x, name), getattr(y, name), strict=True):
                torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=0, atol=1e-5)
        lengths |= {len(ids) for ids in x.action_ids}
    assert len(lengths) > 2 and any(not e for t in a for e in t.ends_with_eos)  # not trivial
    assert [cont.conversation(r) for r in range(4)] == [again.conversation(r) for r in range(4)]


def _forward_stats(model, tokens: list[int], temperature: float):
    """log π and entropies of every next token of ``tokens`` by one forward pass (float32)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1] / temperature
    return token_logprobs(logits[None], ids[:, 1:])[0], entropy_from_logits(logits[None])[0]


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_recorded_logprobs_equal_one_forward_over_the_finished_conversation(arch):
    """Each action token's recorded log π(a | conversation before it) and entropy, at the
    sampling temperature before top-k/top-p, against one forward pass over the row's finished
    conversation (prompt, actions, contexts), read from the positions where the actions lie."""
    model, cfg = _model(arch), _cfg(top_k=5, top_p=0.9)
    conv = _opened(model, cfg, replay=False)
    turns = _play(conv, cfg)
    prompts = _tokens(PROMPT_LENGTHS, 1)
    checked = 0
    for r in range(4):
        full = conv.conversation(r)
        ref_logp, ref_ent = _forward_stats(model, full, cfg.temperature)
        logp, ent, where = [], [], []
        n = len(prompts[r])
        for k, t in enumerate(turns):
            rows = SCHEDULE[k][0]
            if r not in rows:
                break
            if k > 0:
                n += SCHEDULE[k][1][r]  # the context before this turn's action
            i = rows.index(r)
            action = t.action_ids[i]
            assert full[n : n + len(action)] == action  # the conversation is laid out as played
            where += range(n - 1, n - 1 + len(action))  # the logits that predict the action
            logp += t.logprobs[i]
            ent += t.entropy[i]
            n += len(action)
        assert n == len(full)
        torch.testing.assert_close(torch.tensor(logp), ref_logp[where], rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.tensor(ent), ref_ent[where], rtol=0, atol=1e-5)
        checked += len(where)
    assert checked > 20


def test_an_episode_depends_on_its_seed_only():
    """Row 3 played alone, in a batch of four, and named last or first, samples the same episode;
    its first turn is the single-turn decoder's response with the row's seed of turn 1."""
    model, cfg = _model("llama"), _cfg(top_k=5)
    prompts = _tokens(PROMPT_LENGTHS, 1)
    seeds = torch.tensor([11, 12, 13, 14])
    batch = _play(_opened(model, cfg, False, prompts, seeds), cfg)
    reordered = [([3, *[r for r in rows if r != 3]], ctx) for rows, ctx in SCHEDULE]
    first = _play(_opened(model, cfg, False, prompts, seeds), cfg, schedule=reordered)
    alone_schedule = [([0], ctx) for _, ctx in SCHEDULE]
    alone_conv = _opened(model, cfg, False, [prompts[3]], seeds[3:])
    alone = [t.action_ids[0] for t in _play(alone_conv, cfg, alone_schedule, names={0: 3})]

    def row3(turns, schedule):
        return [t.action_ids[rows.index(3)] for t, (rows, _) in zip(turns, schedule, strict=True)]

    assert row3(batch, SCHEDULE) == row3(first, reordered) == alone
    single = sample(
        model, torch.tensor([prompts[3]]), torch.ones(1, len(prompts[3]), dtype=torch.long),
        max_new_tokens=cfg.max_answer_seq_len, temperature=cfg.temperature, top_k=5,
        eos_ids=EOS, pad_id=PAD, row_seeds=turn_seeds(seeds[3:], 1),
    )  # fmt: skip
    assert single[0].tolist()[: len(alone[0])] == alone[0]


def test_the_cache_compacts_and_grows_without_changing_a_token(monkeypatch):
    """Ragged contexts over many turns fill the shared slots (compaction), and a long row beside
    a long context needs more than the cache's slots (growth): the same tokens as re-reading."""
    calls = {"_compact": 0, "_grow": 0}
    for name in calls:
        real = getattr(ContinuedDecoder, name)

        def spy(self, *args, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(ContinuedDecoder, name, spy)
    model, cfg = _model("llama"), _cfg(new=6)
    prompts = _tokens((40, 3, 20), 5)
    # no stop token: every action has 6 tokens. Slots: turn 0 writes 45, turn 1 16 (a context of
    # 10 after the last action's token); turn 2 needs 16 more than the 64 allocated: compacted,
    # row 0 holds 52 valid slots, still 4 short: grown
    schedule = [([0, 1, 2], None)] + [([0, 1, 2], (1, 10, 2))] * 2 + [([1, 2], (None, 10, 1))]
    max_len = 64
    cont = _opened(model, cfg, False, prompts, torch.tensor([1, 2, 3]), max_len=max_len)
    again = _opened(model, cfg, True, prompts, torch.tensor([1, 2, 3]), max_len=max_len)
    a = _play(cont, cfg, schedule, eos=[])
    b = _play(again, cfg, schedule, eos=[])
    assert [t.action_ids for t in a] == [t.action_ids for t in b]
    assert calls["_compact"] >= 1 and calls["_grow"] >= 1
    assert _decoders(cont.sampler)[0].L > 64


def test_calls_the_cache_does_not_match_reread_the_whole_conversations():
    """Called directly (``sample_turns``): a call whose rows the cache holds continues it; an
    action the caller cut short, or a row the cache dropped (left out of an earlier call), makes
    a cache of the call's rows from their whole conversations. Every call samples what re-reading
    the whole conversations through ``sample`` samples."""
    model, cfg = _model("llama"), _cfg(new=6)
    sampler = open_sampler("static", cfg, SamplerSetup(model=model))
    convs = _tokens(PROMPT_LENGTHS, 1)
    seen = [0] * 4

    def turn(rows, seeds):
        token_ids = [list(convs[r]) for r in rows]
        batch = Conversations(token_ids, rows, [seen[r] for r in rows])
        got = sample_turns(sampler, batch, cfg, [], PAD, seeds)  # no stop token: 6 each
        ids, mask = left_pad(token_ids, PAD)
        ref = sample_responses(sampler, ids, mask, cfg, [], PAD, seeds)
        assert torch.equal(got.response_ids, ref.response_ids)
        torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=0, atol=1e-5)
        for b, r in enumerate(rows):
            convs[r] += got.response_ids[b].tolist() + _context(r, len(seeds), 3)
            seen[r] = len(convs[r]) - 3
        return _decoders(sampler)[-1]

    first = turn([0, 1, 2, 3], torch.tensor([1, 2, 3, 4]))
    assert turn([0, 1, 3], torch.tensor([5, 6, 7])) is first  # continued; row 2 dropped
    del convs[1][-5:]  # row 1's last action cut to 4 tokens, its context after it
    seen[1] = len(convs[1])
    convs[1] += [4, 6]
    second = turn([0, 1], torch.tensor([8, 9]))
    assert second is not first
    third = turn([0, 2], torch.tensor([10, 11]))  # row 2 left the cache: re-read
    assert third is not second
    with pytest.raises(ValueError, match="a row named twice"):
        sample_turns(sampler, Conversations([[4], [5]], [0, 0], [0, 0]), cfg, EOS, PAD)
    sampler.end_conversations()
    assert _decoders(sampler) == []


def test_groups_of_rows_that_take_turns_each_continue_their_own_cache():
    """Rows sampled in two groups that take turns (``--env_overlap 2``: the environments step one
    group while the policy samples the other): each group continues a cache of its own, reading
    only its new tokens, and samples what re-reading the whole conversations samples. A group
    that loses a row continues without it."""
    model, cfg = _model("llama"), _cfg(top_k=5)
    schedule = []
    for rows, ctx in SCHEDULE:  # each turn of SCHEDULE as two calls: rows 0-1, then rows 2-3
        schedule += [([r for r in rows if r in g], ctx) for g in ((0, 1), (2, 3))]
    schedule = [(rows, ctx) for rows, ctx in schedule if rows]
    cont = _opened(model, cfg, replay=False)
    again = _opened(model, cfg, replay=True)
    reads = []
    real = ContinuedDecoder._prefill

    def spy(self, pieces, pad_id):
        reads.append(sum(len(p) for p in pieces))
        return real(self, pieces, pad_id)

    ContinuedDecoder._prefill = spy
    try:
        a = _play(cont, cfg, schedule)
    finally:
        ContinuedDecoder._prefill = real
    b = _play(again, cfg, schedule)
    assert [t.action_ids for t in a] == [t.action_ids for t in b]
    assert len(_decoders(cont.sampler)) == 2  # rows 3 and 0 play last, one in each group
    # each call read the new tokens only: the first two calls the prompts, later ones a
    # context and the token sampled last
    prompts = _tokens(PROMPT_LENGTHS, 1)
    assert reads[:2] == [len(prompts[0]) + len(prompts[1]), len(prompts[2]) + len(prompts[3])]
    later = [sum(1 + (0 if ctx is None else ctx[r]) for r in rows) for rows, ctx in schedule[2:]]
    assert reads[2:] == later
    assert [cont.conversation(r) for r in range(4)] == [again.conversation(r) for r in range(4)]


def _decoders(sampler) -> list[ContinuedDecoder]:
    """The static backend's KV caches, oldest first."""
    return [c.decoder for c in sampler._caches]


def test_backends_that_reread_are_given_whole_conversations():
    """``hf`` declares no continuation: ``sample_turns`` re-reads through its ``sample``."""
    assert backend_info("static").continues_conversations
    assert not backend_info("hf").continues_conversations
    assert not backend_info("vllm").continues_conversations  # its prefix cache serves them
    model, cfg = _model("llama"), _cfg()
    sampler = open_sampler("hf", cfg, SamplerSetup(model=model))
    torch.manual_seed(0)
    out = sample_turns(sampler, Conversations([[4, 5], [6]], [0, 1], [0, 0]), cfg, EOS, PAD)
    assert out.logprobs is None and out.response_ids.shape[0] == 2
