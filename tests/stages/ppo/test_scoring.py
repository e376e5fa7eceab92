"""Experience is scored with dropout off: on a model with dropout, the actor's log-probs equal the
reference's (same weights) and the critic's values are its eval-mode values; modes are restored.
The update's first minibatch reuses the scoring critic pass only where it is the same pass."""

import copy

import pytest
import torch

from marlhf.models.load import set_model_dropout
from marlhf.models.sequences import pack_flush_left, response_mask
from marlhf.stages.ppo.config import PPOStageConfig
from marlhf.stages.ppo.forward import critic_forward, policy_forward
from marlhf.stages.ppo.models import Models
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.scoring import score
from tests.support.engine_stub import Engine as _Engine


@pytest.fixture(scope="module")
def dropout_models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from marlhf.models.reward_model import RewardModel
    from marlhf.models.zoo import build_tiny

    path = build_tiny(tmp_path_factory.mktemp("tiny") / "actor")
    torch.manual_seed(0)
    actor = AutoModelForCausalLM.from_pretrained(path)
    critic = RewardModel.from_pretrained(path, init_std=0.5)
    for m in (actor, critic):
        set_model_dropout(m, 0.3)
    ref = copy.deepcopy(actor).eval()
    return actor, critic, ref


def _rollout(seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, 200, (3, 6), generator=g)
    prompt_mask = torch.ones(3, 6, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    response = torch.randint(5, 200, (3, 5), generator=g)
    response[2, 3] = 2  # an EOS: row 2 has 4 tokens
    mask, ends = response_mask(response, eos_ids=[2])
    seq, att, start = pack_flush_left(prompt, prompt_mask, response, mask, pad_id=0)
    return Rollout(seq, att, start, response, mask, ends, ["a", "b", "c"])


def test_experience_is_scored_with_dropout_off_and_modes_are_restored(dropout_models):
    actor, critic, ref = dropout_models
    models = Models(_Engine(actor), _Engine(critic), _Engine(ref), None, {}, {}, {})
    ro = _rollout()
    mask = ro.action_mask
    models.actor.train()
    models.critic.train()
    # with dropout on, two forward passes differ: the model does have dropout
    with torch.no_grad():
        a, _ = policy_forward(models.actor, ro, 0.8)
        b, _ = policy_forward(models.actor, ro, 0.8)
    assert not torch.allclose(a[mask], b[mask])

    first = score(models, ro, PPOStageConfig().trainer, need_entropy=False)
    second = score(models, ro, PPOStageConfig().trainer, need_entropy=False)
    # KL at the first step (actor == reference) is zero
    torch.testing.assert_close(first.old_logprobs[mask], first.ref_logprobs[mask])
    for key in ("old_logprobs", "values", "entropy"):
        assert torch.equal(getattr(first, key), getattr(second, key)), key
    # the values are the critic's eval-mode values
    critic.eval()
    with torch.no_grad():
        expected = critic_forward(models.critic, ro)
    torch.testing.assert_close(first.values[mask], expected[mask])
    # the modes are what they were: the update trains with the models' dropout
    models.critic.train()
    assert actor.training and critic.training
    models.actor.eval()
    score(models, ro, PPOStageConfig().trainer, need_entropy=False)
    assert not actor.training and critic.training


def test_critic_forward_is_reused_only_when_it_is_the_same_pass(dropout_models):
    """The first minibatch's critic pass is taken from scoring on one rank, on the default path,
    and only when the critic has no dropout (scoring runs it without, the update with)."""
    from types import SimpleNamespace

    from marlhf.models.load import set_model_dropout
    from marlhf.stages.ppo.config import PerfConfig
    from marlhf.stages.ppo.scoring import reuses_critic_forward

    critic = copy.deepcopy(dropout_models[1])
    models = SimpleNamespace(critic=_Engine(critic))

    def cfg(**perf):
        return PerfConfig(**perf)

    assert not reuses_critic_forward(models, cfg())  # dropout 0.3
    set_model_dropout(critic, 0.0)
    assert reuses_critic_forward(models, cfg())
    assert not reuses_critic_forward(models, cfg(reuse_critic_forward=False))
    assert not reuses_critic_forward(models, cfg(score_all_positions=True))
    assert not reuses_critic_forward(SimpleNamespace(critic=None), cfg())
