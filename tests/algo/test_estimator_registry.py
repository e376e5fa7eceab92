"""The estimators' registry (marlhf.algo.estimators): each estimator carries its label, description,
group size, per-macro credit, gamma and loss aggregation, and the configuration, its help, its
validation and the run names read them there."""

import dataclasses

import pytest
import torch

from marlhf.algo.estimators import (
    ESTIMATOR_ALIASES,
    ESTIMATORS,
    Estimator,
    EstimatorInputs,
    EstimatorOptions,
    build_estimator,
    estimator_class,
    estimators_help,
    group_size_help,
    register_estimator,
)
from marlhf.macro.config import MacroConfig
from marlhf.stages.ppo.config import ActorCriticConfig, PPOConfig, PPOStageConfig
from marlhf.stages.ppo.naming import run_label


@pytest.fixture
def registry():
    """The estimators a test registers leave the registry afterwards."""
    saved, aliases = dict(ESTIMATORS), dict(ESTIMATOR_ALIASES)
    yield
    ESTIMATORS.clear()
    ESTIMATORS.update(saved)
    ESTIMATOR_ALIASES.clear()
    ESTIMATOR_ALIASES.update(aliases)


def test_the_built_in_estimators_carry_what_the_trainer_asks():
    table = {
        n: (c.label, c.min_group_size, c.per_macro, c.fixed_gamma, c.needs_critic, c.loss_agg_mode)
        for n, c in ESTIMATORS.items()
    }
    assert table == {
        "gae": ("PPO", 1, True, None, True, None),
        "grpo": ("GRPO", 2, False, None, False, None),
        "dr_grpo": ("Dr. GRPO", 2, False, None, False, "seq-mean-token-sum-norm"),
        "rloo": ("RLOO", 2, False, None, False, None),
        "mt_grpo": ("MT-GRPO", 2, False, None, False, None),
        "reinforce_pp": ("REINFORCE++", 1, False, None, False, None),
        "macro_mc": ("MA-MC", 1, True, 1.0, False, None),
    }
    # how a multi-turn rollout's per-turn rewards enter each (--env), and which need turns
    turns = {n: (c.turn_rewards, c.needs_turns) for n, c in ESTIMATORS.items()}
    assert turns == {
        "gae": ("tokens", False),
        "grpo": ("outcome", False),
        "dr_grpo": ("outcome", False),
        "rloo": ("outcome", False),
        "mt_grpo": ("own", True),
        "reinforce_pp": ("tokens", False),
        "macro_mc": ("outcome", False),
    }
    assert all(c.name == n and c.description for n, c in ESTIMATORS.items())
    assert estimator_class("reinforce++") is ESTIMATORS["reinforce_pp"]


def test_the_flag_help_lists_every_estimator_and_its_description():
    text = estimators_help()
    for name, cls in ESTIMATORS.items():
        assert f"`{name}` ({cls.description})" in text
    assert "Only `gae` builds a critic" in text and "reinforce++=reinforce_pp" in text
    fields = {f.name: f for f in dataclasses.fields(PPOConfig)}
    assert fields["advantage_estimator"].metadata["help"] == text
    assert (
        fields["n_samples_per_prompt"]
        .metadata["help"]
        .endswith("grpo, dr_grpo, rloo and mt_grpo need G >= 2.")
    )


@dataclasses.dataclass(frozen=True)
class Halved(Estimator):
    """A test's estimator: half the score of each response, on every token."""

    label = "HALF"
    description = "half the score"
    min_group_size = 3
    per_macro = True
    fixed_gamma = 0.5
    loss_agg_mode = "seq-mean-token-mean"

    @classmethod
    def validate(cls, ppo):
        if ppo.whiten_advantages:
            raise ValueError("--advantage_estimator halved: --whiten_advantages undoes the halving")

    def __call__(self, inputs):
        adv = inputs.scores[:, None] / 2 * inputs.action_mask
        return adv, None


def _ppo(**kw):
    return PPOConfig(
        **{"advantage_estimator": "half", "n_samples_per_prompt": 3, "gamma": 0.5, **kw}
    )


def test_a_registered_estimator_is_validated_and_named_by_what_it_carries(registry):
    register_estimator("halved", aliases=("half",))(Halved)
    assert Halved.name == "halved" and "`halved` (half the score)" in estimators_help()
    assert group_size_help() == (
        "grpo, dr_grpo, rloo and mt_grpo need G >= 2. halved needs G >= 3."
    )
    for kw, message in (
        ({"n_samples_per_prompt": 2}, "--advantage_estimator half compares the samples of one prompt: set "
         "--n_samples_per_prompt to 3 or more \\(got 2\\)"),
        ({"gamma": 1.0}, "halved is discounted by 0.5: --gamma must be 0.5, got 1.0"),
        ({"loss_agg_mode": "token-mean"}, "--loss_agg_mode token-mean contradicts it"),
        ({"critic_warmup_steps": 1}, "halved trains no critic"),
        ({"whiten_advantages": True}, "--whiten_advantages undoes the halving"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            _ppo(**kw)
    ppo = _ppo()
    assert ppo.estimator == "halved" and not ppo.needs_critic and not ppo.needs_mc
    assert ppo.policy_loss_agg_mode == "seq-mean-token-mean"
    models = ActorCriticConfig(reward_model_name_or_path="rm")
    # per-macro: --macro_credit boundary is allowed; labels from the class and the rule
    cfg = PPOStageConfig(
        models=models, ppo=ppo, macro=MacroConfig(ngram=3, macro_credit="boundary")
    )
    assert run_label(cfg) == "HALF, macro n=3, boundary credit"
    assert run_label(PPOStageConfig(models=models, ppo=ppo)) == "HALF"
    with pytest.raises(ValueError, match="--gamma must be 0.5"):
        build_estimator("half", EstimatorOptions(gamma=1.0))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    inputs = EstimatorInputs(torch.zeros(2, 3), torch.tensor([2.0, -4.0]), mask)
    adv, _ = build_estimator("half", EstimatorOptions(gamma=0.5))(inputs)
    assert adv.tolist() == [[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]]


def test_boundary_credit_names_the_per_macro_estimators(registry):
    with pytest.raises(ValueError, match="--advantage_estimator gae or macro_mc \\(got rloo"):
        PPOStageConfig(
            models=ActorCriticConfig(reward_model_name_or_path="rm"),
            ppo=PPOConfig(advantage_estimator="rloo", n_samples_per_prompt=2),
            macro=MacroConfig(macro_credit="boundary"),
        )
    register_estimator("halved")(Halved)
    with pytest.raises(ValueError, match="gae or macro_mc or halved \\(got grpo"):
        PPOStageConfig(
            models=ActorCriticConfig(reward_model_name_or_path="rm"),
            ppo=PPOConfig(advantage_estimator="grpo", n_samples_per_prompt=2),
            macro=MacroConfig(macro_credit="boundary"),
        )


def test_registration_takes_estimator_classes_once(registry):
    with pytest.raises(TypeError, match="decorates an Estimator subclass"):
        register_estimator("fn")(lambda options: None)
    with pytest.raises(ValueError, match="'grpo' is registered twice"):
        register_estimator("grpo")(Halved)
    with pytest.raises(ValueError, match="'dr-grpo' is registered twice"):
        register_estimator("other", aliases=("dr-grpo",))(Halved)
    with pytest.raises(ValueError, match="name its file with --plugin"):
        estimator_class("halved")
