"""Tests for marlhf.rewards.registry, marlhf.rewards.terms and marlhf.rewards.sources: the checks
every reward value passes, how terms add up, and what ``--reward_source`` names."""

import doctest
import math

import pytest
import torch

import marlhf.rewards.registry as registry
import marlhf.rewards.sources as sources
import marlhf.rewards.terms as terms
from marlhf.rewards.config import RewardConfig
from marlhf.rewards.terms import RewardBatch, RewardError, RewardTerm, check_values, combine


def test_doctests():
    assert doctest.testmod(registry).failed == 0
    assert doctest.testmod(terms).failed == 0
    assert doctest.testmod(sources).failed == 0


def _batch(n=3):
    return RewardBatch(
        prompts=[f"What is {i} + {i}?" for i in range(n)],
        completions=[str(2 * i) for i in range(n)],
        metas=[{"columns": {"answer": str(2 * i)}} for i in range(n)],
    )


@pytest.mark.parametrize(
    ("raw", "row", "shown"),
    [
        ([1.0, float("nan"), 2.0], 1, "nan"),
        ([1.0, 2.0, float("inf")], 2, "inf"),
        (["0.5", 1.0, 2.0], 0, "'0.5'"),
        ([1.0, [1.0], 2.0], 1, "[1.0]"),
    ],
)
def test_a_value_that_is_not_a_finite_number_names_the_reward_the_row_and_the_value(
    raw, row, shown
):
    batch = _batch()
    with pytest.raises(RewardError) as e:
        check_values("--reward_fn f.py:score", raw, batch, "raise")
    msg = str(e.value)
    assert msg.startswith("--reward_fn f.py:score, ")
    assert f"row {row} of the batch" in msg and f"What is {row} + {row}?" in msg
    assert f"returned {shown}" in msg
    # with --reward_errors zero: that value is 0, the others stay, one error counted
    values, scored, n = check_values("f", raw, batch, "zero")
    good = [0.0 if i == row else float(v) for i, v in enumerate(raw)]
    assert values.tolist() == good and scored.all() and n == 1


@pytest.mark.parametrize(
    ("raw", "what"),
    [([1.0, 2.0], "returned 2 values for a batch of 3 rows"), (0.5, "returned float 0.5")],
)
def test_a_result_of_the_wrong_length_or_type_is_refused_whole(raw, what):
    with pytest.raises(RewardError, match=what):
        check_values("f", raw, _batch(), "raise")
    values, scored, n = check_values("f", raw, _batch(), "zero")
    assert values.tolist() == [0.0] * 3 and n == 3


def test_ints_bools_numpy_and_none_are_values():
    import numpy as np

    values, scored, n = check_values("f", [1, True, None], _batch(), "raise")
    assert values.tolist() == [1.0, 1.0, 0.0] and scored.tolist() == [True, True, False] and n == 0
    values, _, _ = check_values("f", np.array([0.5, 1.5, 2.5]), _batch(), "raise")
    assert values.tolist() == [0.5, 1.5, 2.5]


def test_terms_add_up_with_their_weights_and_none_leaves_a_term_out_of_a_row():
    batch = _batch()
    a = RewardTerm("a", torch.tensor([1.0, 0.0, 3.0]), torch.tensor([True, False, True]), 2.0)
    b = RewardTerm("b", torch.tensor([0.5, 0.25, 0.0]), weight=-1.0)
    scores, metrics = combine([a, b], batch, torch.device("cpu"), "raise")
    assert scores.tolist() == [2 * 1.0 - 0.5, -0.25, 2 * 3.0]
    # each term's mean over the rows it scored, and the share it scored
    assert metrics["reward/a"] == 2.0 and metrics["reward/a/scored"] == pytest.approx(2 / 3)
    assert metrics["reward/b"] == pytest.approx(0.25) and "reward/b/scored" not in metrics
    assert "reward/errors" not in metrics


def test_a_row_no_reward_scored_is_an_error_or_a_counted_zero():
    batch = _batch()
    a = RewardTerm("a", torch.tensor([1.0, 0.0, 3.0]), torch.tensor([True, False, True]))
    with pytest.raises(RewardError, match=r"row 1 of the batch .*no reward scored it"):
        combine([a], batch, torch.device("cpu"), "raise")
    b = RewardTerm("b", torch.zeros(3), torch.zeros(3, dtype=torch.bool), errors=2)
    scores, metrics = combine([a, b], batch, torch.device("cpu"), "zero")
    assert scores.tolist() == [1.0, 0.0, 3.0]
    assert metrics["reward/errors"] == 3.0  # b's two, and row 1 that nothing scored


def test_reward_source_names_resolution_and_order():
    assert registry.source_names("rm+code") == registry.source_names("code+rm") == ("rm", "code")
    assert registry.source_names("none") == ()
    with pytest.raises(ValueError, match=r"'gld' is no reward source \(did you mean gold\?\)"):
        registry.source_names("gld+code")
    with pytest.raises(ValueError, match="names a source twice"):
        registry.source_names("rm+rm")
    resolve = registry.resolve_reward_source
    assert resolve("auto", False, ("synthetic-tldr",)) == "rm"
    assert resolve("auto", True, ("synthetic-tldr",)) == "none"
    assert resolve("auto", False, ("reasoning-gym:leg_counting",)) == "reasoning-gym"
    assert resolve("auto", False, ("reasoning-gym:leg_counting", "data.jsonl")) == "rm"
    assert resolve("gold", True, ("synthetic-tldr",)) == "gold"  # given: kept
    assert registry.reads_reward_model("rm+code") and not registry.reads_reward_model("code+math")


def test_some_reward_must_be_given_and_a_critic_free_rm_run_needs_the_model():
    with pytest.raises(ValueError, match="--reward_source none gives no reward"):
        registry.check_reward_flags("none", RewardConfig())
    registry.check_reward_flags("none", RewardConfig(reward_fn=("f.py:g",)))
    with pytest.raises(ValueError, match="--advantage_estimator grpo trains no critic"):
        registry.check_reward_flags("rm", RewardConfig(), "grpo", reward_model_given=False)
    registry.check_reward_flags("math", RewardConfig(), "grpo", reward_model_given=False)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"reward_fn": ("score",)}, "--reward_fn takes path/to/file.py:name"),
        ({"reward_fn": ("f.py:a", "f.py:b"), "reward_weights": (1.0,)}, "2 weights|1 weights"),
        ({"reward_url": "localhost:8000"}, "--reward_url must be an http"),
        ({"reward_weights": (math.nan,), "reward_fn": ("f.py:a",)}, "finite"),
        ({"reward_concurrency": 0}, "--reward_concurrency must be >= 1"),
        ({"reward_timeout_s": 0.0}, "--reward_timeout_s must be > 0"),
    ],
)
def test_reward_flags_are_checked(flags, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(**flags)


def test_the_stage_config_resolves_auto_and_refuses_unknown_sources():
    from marlhf.cli import parse_config
    from marlhf.stages.ppo.config import PPOStageConfig

    cfg = parse_config(
        PPOStageConfig,
        ["--reward_fn", "a.py:f", "--reward_fn", "b.py:g", "--advantage_estimator", "grpo",
         "--n_samples_per_prompt", "2"],
    )  # fmt: skip
    assert cfg.ppo.reward_source == "auto" and cfg.reward_source == "none"
    assert cfg.reward.reward_fn == ("a.py:f", "b.py:g")
    assert PPOStageConfig().reward_source == "rm"
    with pytest.raises(SystemExit):
        parse_config(PPOStageConfig, ["--reward_source", "rm+gpt"])


def test_a_reward_error_is_one_error_line_from_the_rank_it_happened_on():
    from marlhf.stages.exits import error_line, exit_status, raised_on_purpose

    e = RewardError("--reward_fn f.py:g, row 0 of the batch (prompt 'x'): returned nan")
    # not an input error (printed by rank 0 only): the failing rank prints it, the run fails
    assert raised_on_purpose(e) and exit_status(e) == 1
    assert (
        error_line(e) == "error: --reward_fn f.py:g, row 0 of the batch (prompt 'x'): returned nan"
    )


def test_every_built_in_source_names_functions_that_exist():
    """The built-ins are declared by reference (``module:function``, imported when built): each
    reference resolves to a function of the module the declaration names."""
    assert registry.sum_order() == ("gold", "rm", "code", "math", "reasoning-gym")
    for source in registry.REWARD_SOURCES.values():
        for name in ("build", "prompt_ok", "check"):
            ref = getattr(source, name)
            if ref is None:
                continue
            assert isinstance(ref, str), (source.name, name)
            module, _, attr = ref.partition(":")
            fn = source.function(name)
            assert callable(fn) and fn.__module__ == module and fn.__name__ == attr


# a reward source of the user's, in one file a --plugin names
SOURCE_PLUGIN = """
import torch

from marlhf.rewards.registry import RewardSource, register_source
from marlhf.rewards.terms import RewardTerm


def build(ctx):
    def length(batch):
        values = torch.tensor([float(len(c)) for c in batch.completions])
        return [RewardTerm("length", values)]

    return length


register_source(
    RewardSource(name="length", help="the response's length in characters", needs="nothing",
                 build=build)
)
"""


def test_a_plugin_file_registers_a_reward_source(tmp_path):
    import sys

    from marlhf.cli import parse_config
    from marlhf.plugins import plugin_module_name
    from marlhf.stages.ppo.config import PPOStageConfig

    path = tmp_path / "my_source.py"
    path.write_text(SOURCE_PLUGIN)
    flags = ["--advantage_estimator", "grpo", "--n_samples_per_prompt", "2"]
    try:
        cfg = parse_config(
            PPOStageConfig, ["--reward_source", "length+gold", "--plugin", str(path), *flags]
        )
        # added after the built-ins, in the order of registration; no reward model read
        assert registry.source_names(cfg.reward_source) == ("gold", "length")
        assert not registry.reads_reward_model(cfg.reward_source)
        (source,) = registry.build_sources(["length"], registry.RewardContext())
        batch = RewardBatch(["p", "q"], ["ab", "abcd"], [{}, {}])
        scores, metrics = combine(source(batch), batch, torch.device("cpu"), "raise")
        assert scores.tolist() == [2.0, 4.0] and metrics["reward/length"] == 3.0
    finally:
        registry.REWARD_SOURCES.pop("length", None)
        sys.modules.pop(plugin_module_name(path), None)
    with pytest.raises(SystemExit):  # without its plugin the name is no source
        parse_config(PPOStageConfig, ["--reward_source", "length", *flags])
