"""Multi-turn rollouts played by a generation backend (``marlhf.stages.ppo.multiturn.play``) on the
trail task with the shipped ``tiny-base-trail``: the conversation in tokens is what the chat
template lays out around the sampled tokens (``ChatLayout.build``, rebuilt independently), the
log-probs recorded while sampling turn by turn equal one forward pass over the finished
conversation, a row plays the same episode in any batch, and a backend that continues
conversations is given exactly the tokens it has not seen (the contract of
``GenerationBackend.sample_turn``) and samples what re-reading the conversation samples; the
static decoder continues each batch's conversations from one KV cache, reading only their new
tokens."""

from __future__ import annotations

import pytest
import torch

from marlhf.data.env_rows import load_env_rows
from marlhf.envs.config import EnvConfig
from marlhf.models.continuation import ContinuedDecoder
from marlhf.models.conversation import ChatLayout
from marlhf.models.generation import SamplerSetup, get_backend, open_sampler
from marlhf.models.zoo import ensure_trail_base
from marlhf.stages.ppo.config import GenerationConfig
from marlhf.stages.ppo.multiturn import env_setup, play


class Actor(torch.nn.Module):
    """What ``play`` reads of the actor engine: its module, device, modes, ZeRO stage."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    @property
    def device(self):
        return next(self.module.parameters()).device

    def zero_optimization_stage(self) -> int:
        return 0


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_trail_base()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = GenerationConfig(
        max_answer_seq_len=16, temperature=1.0, top_k=0, generation_backend="static"
    )
    env = env_setup(EnvConfig(env="marlhf-trail-4", env_timeout_s=0, max_total_seq_len=200), tok)
    rows = load_env_rows(("marlhf-trail-4:6",))
    return tok, model, g, env, rows


def _rereading(model):
    """The static decoder made to re-read every conversation at each turn (``sample``)."""

    class Rereading(get_backend("static")):
        continues_conversations = False

    return Rereading(model, inference_mode=True)


def _play(setup, rows, seeds, sampler=None):
    tok, model, g, env, _ = setup
    sampler = sampler or open_sampler("static", g, SamplerSetup(model=model))
    return play(env, Actor(model), sampler, rows, g, [tok.eos_token_id], tok.pad_token_id, seeds)


def test_the_conversation_is_the_templates_layout_of_the_sampled_tokens_and_its_forward(setup):
    tok, model, g, env, rows = setup
    ro, episodes = _play(setup, rows, torch.arange(100, 106))
    layout = ChatLayout(tok)
    assert sum(len(e.turns) for e in episodes) > len(episodes)  # several turns were played
    for b, ep in enumerate(episodes):
        n = int(ro.action_mask[b].sum())
        ids, turn = ro.response_ids[b, :n].tolist(), ro.turn_index[b, :n].tolist()
        per_turn = [
            [t for t, k in zip(ids, turn, strict=True) if k == i + 1] for i in range(len(ep.turns))
        ]
        assert [tok.decode(x, skip_special_tokens=True) for x in per_turn] == [
            t.action for t in ep.turns
        ]
        # an independent layout of the episode: the chat template around the sampled tokens
        built = layout.build(
            ep.prompt, [(t.action, x) for t, x in zip(ep.turns, per_turn, strict=True)],
            [t.observations for t in ep.turns],
        )  # fmt: skip
        L = len(built.token_ids)
        assert ro.sequences[b, :L].tolist() == built.token_ids
        assert int(ro.attention_mask[b].sum()) == L
        # the log-probs recorded turn by turn (each turn sampled after re-reading the whole
        # conversation) are those of one forward pass over the finished conversation
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([built.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits / g.temperature, -1)
        where = [p for p, a in enumerate(built.action_mask) if a]
        single = [float(logp[p - 1, built.token_ids[p]]) for p in where]
        assert ro.logprobs[b, :n].tolist() == pytest.approx(single, abs=2e-5)


def test_a_row_plays_the_same_episode_in_any_batch(setup):
    *_, rows = setup
    seeds = torch.arange(7, 13)
    ro, eps = _play(setup, rows, seeds)
    pick = [4, 1]
    ro2, eps2 = _play(setup, [rows[i] for i in pick], seeds[pick])
    for j, i in enumerate(pick):
        L = int(ro.attention_mask[i].sum())
        assert int(ro2.attention_mask[j].sum()) == L
        assert torch.equal(ro2.sequences[j, :L], ro.sequences[i, :L])
        assert eps2[j].messages == eps[i].messages
    ro3, _ = _play(setup, rows, seeds + 1)  # other seeds, other episodes
    assert not torch.equal(ro3.sequences, ro.sequences)


def test_overlapped_steps_play_the_same_rollout(setup):
    """``--env_overlap 3``: the rows sampled in three groups that take turns (the environments
    step one while the policy samples the next) play the same episodes, tokens and log-probs as
    one group, each group continued from a KV cache of its own."""
    import dataclasses

    tok, model, g, env, rows = setup
    seeds = torch.arange(40, 46)
    ro, eps = _play(setup, rows, seeds)
    overlapped = dataclasses.replace(env, cfg=dataclasses.replace(env.cfg, env_overlap=3))
    sampler = open_sampler("static", g, SamplerSetup(model=model))
    ro3, eps3 = play(overlapped, Actor(model), sampler, rows, g, [tok.eos_token_id],
                     tok.pad_token_id, seeds)  # fmt: skip
    assert [e.messages for e in eps3] == [e.messages for e in eps]
    assert torch.equal(ro3.sequences, ro.sequences) and torch.equal(ro3.action_mask, ro.action_mask)
    # a smaller batch rounds differently in the last bits, as in any batch split
    torch.testing.assert_close(ro3.logprobs, ro.logprobs, rtol=0, atol=1e-5)
    assert sum(len(e.turns) for e in eps) > len(eps)


def test_a_backend_that_continues_is_given_only_the_new_tokens(setup):
    tok, model, g, env, rows = setup
    static = get_backend("static")
    calls, ends = [], []

    class Continuing(static):
        """Keeps each row's tokens as its 'state', checks what it is told it has seen, and
        samples by re-reading the whole conversation (so the tokens must come out the same)."""

        continues_conversations = True

        def __init__(self):
            super().__init__(model, inference_mode=True)
            self.state: dict[int, list[int]] = {}

        def sample_turn(self, conversations, cfg, eos_ids, pad_id, row_seeds=None):
            for ids, row, seen in zip(
                *(conversations.token_ids, conversations.rows, conversations.seen), strict=True
            ):
                kept = self.state.get(row, [])
                assert seen == len(kept) and ids[:seen] == kept  # the state is a prefix
                calls.append((row, seen, len(ids)))
            from marlhf.models.generation.sampling import left_pad

            prompt, mask = left_pad(conversations.token_ids, pad_id)
            out = self.sample(prompt, mask, cfg, eos_ids, pad_id, row_seeds)
            for b, (ids, row) in enumerate(
                zip(conversations.token_ids, conversations.rows, strict=True)
            ):
                sampled = out[0][b].tolist()
                n = next((i + 1 for i, t in enumerate(sampled) if t in eos_ids), len(sampled))
                self.state[row] = ids + sampled[:n]
            return out

        def end_conversations(self):
            ends.append(len(self.state))
            self.state.clear()

    seeds = torch.arange(30, 36)
    ro, eps = _play(setup, rows, seeds, Continuing())
    plain, plain_eps = _play(setup, rows, seeds, _rereading(model))
    assert torch.equal(ro.sequences, plain.sequences) and torch.equal(ro.logprobs, plain.logprobs)
    assert [e.messages for e in eps] == [e.messages for e in plain_eps]
    assert ends == [len(rows)]  # the states are dropped once, after the episodes
    # every row's first call has seen nothing, each later one everything but the new context
    firsts = [c for c in calls if c[1] == 0]
    assert sorted(r for r, _, _ in firsts) == list(range(len(rows)))
    assert all(seen < total for _, seen, total in calls)


def test_the_static_decoder_continues_from_its_kv_cache(setup, monkeypatch):
    """The run's static backend plays the episodes of re-reading every conversation (the same
    tokens, log-probs within float rounding), one KV cache per batch of episodes: after each
    row's first prompt, every turn prefills only the tokens after the row's last sampled one."""
    tok, model, g, env, rows = setup
    decoders, prefilled = [], []
    real_init, real_prefill = ContinuedDecoder.__init__, ContinuedDecoder._prefill

    def init(self, *args, **kwargs):
        decoders.append(self)
        real_init(self, *args, **kwargs)

    def prefill(self, pieces, pad_id):
        prefilled.append([len(p) for p in pieces])
        return real_prefill(self, pieces, pad_id)

    monkeypatch.setattr(ContinuedDecoder, "__init__", init)
    monkeypatch.setattr(ContinuedDecoder, "_prefill", prefill)
    seeds = torch.arange(40, 46)
    ro, eps = _play(setup, rows, seeds)
    ref, ref_eps = _play(setup, rows, seeds, _rereading(model))
    assert [e.messages for e in eps] == [e.messages for e in ref_eps]
    assert torch.equal(ro.sequences, ref.sequences)
    torch.testing.assert_close(ro.logprobs, ref.logprobs, rtol=0, atol=1e-5)
    assert len(decoders) == 1 and len(prefilled) > 2  # one cache, several turns
    assert prefilled[0] == ro.response_start.tolist()  # the first prompts
    # every token of a conversation is prefilled once, or fed by a decode step (an action's
    # tokens but its last), or never read (the last action's last token)
    length, actions = ro.attention_mask.sum(1), ro.action_mask.sum(1)
    n_actions = ro.turn_end.sum(1)
    assert sum(map(sum, prefilled)) == int((length - actions + n_actions - 1).sum())
