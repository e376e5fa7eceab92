"""A multi-turn rollout (``--env``) from the layout to the loss, against plain per-row loops: the
compacted actions and where they sit, each turn's reward on its last action token, turn-level GAE
over the turns, and no policy gradient, KL or entropy term on an observation token (perturbing the
logits that predict observations leaves the loss bit-identical, and their gradient is exactly 0)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from marlhf.data.config import DataConfig
from marlhf.envs.config import EnvConfig
from marlhf.envs.runner import Episode, Turn
from marlhf.macro import MacroConfig, build_termination
from marlhf.models.conversation import ConversationTokens
from marlhf.stages.ppo.config import PerfConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.experience import estimate, make_experience
from marlhf.stages.ppo.forward import critic_forward, policy_forward
from marlhf.stages.ppo.multiturn import conversation_rollout
from marlhf.stages.ppo.scoring import Scored
from marlhf.stages.ppo.update import actor_loss, minibatches

V, EOS, PAD = 23, 1, 0
# (first prompt, [(action tokens, context tokens after it), ...], each turn's reward)
CONVERSATIONS = [
    ([5, 6, 7], [([8, 9, EOS], [10, 11, 12]), ([13, EOS], [14]), ([15, 16, 17, EOS], [])], [0.5, None, 1.0]),
    ([5, 7], [([9, 9, 9, 9, EOS], [])], [2.0]),
    ([6, 5, 7, 8], [([19, EOS], [20, 21, 22, 20, 21]), ([18, 18], [EOS, 10])], [-1.0, 0.25]),
]  # fmt: skip


def _conversation(prompt, turns) -> ConversationTokens:
    c = ConversationTokens()
    c.extend(prompt, False, 0)
    c.prompt_len = len(prompt)
    for k, (action, context) in enumerate(turns, start=1):
        c.extend(action, True, k)
        c.turn_ends.append(len(c.token_ids) - 1)
        if k < len(turns):
            c.extend(context, False, k)
    return c


def _rollout():
    convs = [_conversation(p, t) for p, t, _ in CONVERSATIONS]
    episodes = [
        Episode(i, [], [Turn(f"a{k}", reward=r) for k, r in enumerate(rs)])
        for i, (_, _, rs) in enumerate(CONVERSATIONS)
    ]
    return conversation_rollout(convs, episodes, PAD, [EOS], ["r0", "r1", "r2"])


class Logits:
    """An 'engine' whose logits are a free (B, T, V) parameter, one row per conversation (found by
    its tokens, so any slice or order of the rows gets its own), no LM head to hook."""

    def __init__(self, sequences: torch.Tensor, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.sequences = sequences
        self.logits = torch.nn.Parameter(torch.randn(*sequences.shape, V, generator=g))
        self.module = self

    def _row(self, ids: torch.Tensor) -> int:
        return next(i for i, s in enumerate(self.sequences) if torch.equal(s[: len(ids)], ids))

    def _rows(self, input_ids):
        return self.logits[[self._row(r) for r in input_ids], : input_ids.shape[1]]

    def __call__(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self._rows(input_ids))


class Values(Logits):
    """A critic 'engine': its values (B, T) are the first logit."""

    def __call__(self, input_ids, attention_mask=None):
        return self._rows(input_ids)[..., 0]


def test_the_layout_holds_the_conversations_and_compacts_their_actions():
    ro = _rollout()
    for b, (prompt, turns, rewards) in enumerate(CONVERSATIONS):
        whole = prompt + [t for a, c in turns[:-1] for t in a + c] + turns[-1][0]
        actions = [t for a, _ in turns for t in a]
        n = len(actions)
        assert ro.sequences[b, : len(whole)].tolist() == whole
        assert int(ro.attention_mask[b].sum()) == len(whole) and int(ro.response_start[b]) == len(
            prompt
        )
        assert ro.response_ids[b, :n].tolist() == actions
        assert ro.action_mask[b].tolist() == [j < n for j in range(ro.action_mask.shape[1])]
        # each action sits where action_positions says, after the first prompt
        where = [int(ro.response_start[b]) + int(p) for p in ro.action_positions[b, :n]]
        assert [whole[w] for w in where] == actions
        # turn k's reward on its last action token, nothing elsewhere
        ends, index, placed, seen = [], [], [], 0
        for k, ((a, _), r) in enumerate(zip(turns, rewards, strict=True), start=1):
            seen += len(a)
            ends.append(seen - 1)
            index += [k] * len(a)
            placed.append(0.0 if r is None else r)
        assert torch.nonzero(ro.turn_end[b]).flatten().tolist() == ends
        assert ro.turn_index[b, :n].tolist() == index
        expected = torch.zeros(ro.turn_rewards.shape[1])
        expected[ends] = torch.tensor(placed)
        assert torch.equal(ro.turn_rewards[b], expected)
    # the last turn of row 2 was cut (no EOS): its end-of-turn token is context, not an action
    assert ro.ends_with_eos.tolist() == [True, True, False]


def _config(estimator="gae", rule="turn", **ppo):
    return PPOStageConfig(
        ppo=PPOConfig(advantage_estimator=estimator, reward_clip=2.5, **ppo),
        macro=MacroConfig(
            termination_condition=rule, ngram=2, eos_own_macro=False, value_function="start"
        ),
        data=DataConfig(data_path=("marlhf-trail-2",)),
        env=EnvConfig(env="marlhf-trail-2"),
        perf=PerfConfig(length_groups=1),
    )


def _experience(cfg, kl_coef=0.1, scores=(0.3, -0.4, 3.0)):
    ro = _rollout()
    actor = Logits(ro.sequences, seed=1)
    ref = Logits(ro.sequences, seed=2)
    critic = Values(ro.sequences, seed=3)
    with torch.no_grad():
        old, ent = policy_forward(actor, ro, 1.0, with_entropy=True)
        ref_logp, _ = policy_forward(ref, ro, 1.0)
        values = critic_forward(critic, ro)
    scored = Scored(old_logprobs=old, entropy=ent, ref_logprobs=ref_logp, values=values)
    rule = build_termination(cfg.macro)
    term, exp = make_experience(
        rule, ro, scored, torch.tensor(scores), cfg.ppo, kl_coef, row_seeds=torch.arange(3)
    )
    return actor, term, exp


def test_per_turn_rewards_go_on_each_turns_last_action_token():
    kl_coef, scores = 0.1, (0.3, -0.4, 3.0)
    _, _, exp = _experience(_config(), kl_coef, scores)
    for b, (_, turns, rewards) in enumerate(CONVERSATIONS):
        n = sum(len(a) for a, _ in turns)
        kl = exp.old_logprobs[b, :n] - exp.ref_logprobs[b, :n]
        want = [-kl_coef * float(x) for x in kl]
        seen = 0
        for (a, _), r in zip(turns, rewards, strict=True):
            seen += len(a)
            want[seen - 1] += 0.0 if r is None else r
        want[n - 1] += max(-2.5, min(2.5, scores[b]))  # the clipped score on the last action
        assert exp.rewards[b, :n].tolist() == pytest.approx(want, abs=1e-6)
        assert exp.rewards[b, n:].abs().sum() == 0


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8)])
def test_turn_level_gae_matches_a_loop_over_each_rows_turns(gamma, lam):
    cfg = _config(gamma=gamma, lam=lam)
    kl_coef, scores = 0.1, (0.3, -0.4, 3.0)
    actor, term, exp = _experience(cfg, kl_coef, scores)
    exp = estimate(exp, term, cfg)
    for b, (_, turns, rewards) in enumerate(CONVERSATIONS):
        # the turns of row b: reward R_k (its tokens' KL rewards, its reward, the score on the
        # last), value V_k at its first action token; GAE backwards over the turns
        spans, start = [], 0
        for a, _ in turns:
            spans.append(range(start, start + len(a)))
            start += len(a)
        R, Vk = [], []
        for k, span in enumerate(spans):
            kl = sum(float(exp.old_logprobs[b, t] - exp.ref_logprobs[b, t]) for t in span)
            R.append(-kl_coef * kl + (rewards[k] or 0.0))
            Vk.append(float(exp.values[b, span[0]]))
        R[-1] += max(-2.5, min(2.5, scores[b]))
        A, last = [0.0] * len(spans), 0.0
        for k in reversed(range(len(spans))):
            nxt = Vk[k + 1] if k + 1 < len(spans) else 0.0
            last = R[k] + gamma * nxt - Vk[k] + gamma * lam * last
            A[k] = last
        for k, span in enumerate(spans):
            for t in span:
                assert float(exp.advantages[b, t]) == pytest.approx(A[k], abs=1e-5)
                assert float(exp.returns[b, t]) == pytest.approx(A[k] + Vk[k], abs=1e-5)
        assert exp.segment_ids[b, :start].tolist() == [
            k for k, span in enumerate(spans) for _ in span
        ]


@pytest.mark.parametrize(
    "estimator, rule, extra",
    [
        ("gae", "turn", {}),
        ("gae", "fixed", {"ratio_level": "macro"}),
        ("rloo", "fixed", {"n_samples_per_prompt": 3, "ratio_level": "sequence"}),
        ("reinforce_pp", "turn", {}),
    ],
)
def test_observation_tokens_get_no_policy_gradient_kl_or_entropy(estimator, rule, extra):
    cfg = _config(estimator, rule, entropy_coef=0.3, kl_loss_coef=0.2, **extra)
    actor, term, exp = _experience(cfg)
    exp = estimate(exp, term, cfg)
    cfg.ppo.per_device_training_batch_size = 3
    (m,) = list(minibatches(exp, cfg.ppo, torch.Generator().manual_seed(0)))
    models = SimpleNamespace(actor=actor)
    loss, _ = actor_loss(models, exp, m, cfg)
    loss.backward()
    grad = actor.logits.grad
    # the positions whose logits predict an action: the state before each action token
    ro = exp.rollout
    predicts_action = torch.zeros(ro.sequences.shape, dtype=torch.bool)
    for b in range(3):
        n = int(ro.action_mask[b].sum())
        for j in range(n):
            predicts_action[b, int(ro.response_start[b]) - 1 + int(ro.action_positions[b, j])] = (
                True
            )
    assert grad[~predicts_action].abs().max() == 0  # prompt, observations, padding: exactly 0
    assert (grad[predicts_action].abs().sum(-1) > 0).all()  # every action token is trained
    # perturbing the log-probs of every other token changes nothing, bit for bit
    with torch.no_grad():
        noise = torch.randn(actor.logits.shape, generator=torch.Generator().manual_seed(9))
        actor.logits += noise * (~predicts_action)[..., None] * 5
    again, _ = actor_loss(models, exp, m, cfg)
    assert torch.equal(again.detach(), loss.detach())
