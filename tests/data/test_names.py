"""One set of dataset names for inference, the LLM judge and evaluation-set sampling."""

import doctest

import pytest

import marlhf.data.names as datasets
from marlhf.cli import build_parser
from marlhf.inference import InferenceArgs, InferenceConfig, dataset_spec, output_path
from marlhf.judge.config import JudgeConfig, JudgeStage, template_for
from marlhf.judge.sampling import SampleConfig, SampleStage, sample_records

NAMES = ("summarize", "hh-rlhf", "webgpt", "apps", "synthetic")


def test_doctests():
    assert doctest.testmod(datasets).failed == 0


def test_every_tool_lists_the_names_in_help():
    for stage in (InferenceArgs, JudgeStage, SampleStage):
        text = " ".join(build_parser(stage).format_help().split())
        for name in NAMES:
            assert name in text, (stage.__name__, name)
        assert "hh-rlhf (alias hh)" in text and "summarize (alias tldr)" in text, stage.__name__


@pytest.mark.parametrize(("alias", "name"), [("hh", "hh-rlhf"), ("tldr", "summarize")])
def test_aliases_mean_the_same_everywhere(alias, name):
    assert dataset_spec(alias) == dataset_spec(name) == datasets.DATASETS[name]
    assert output_path(InferenceConfig(proj_path="/p", dataset=alias, model="m")) == output_path(
        InferenceConfig(proj_path="/p", dataset=name, model="m")
    )
    assert template_for(alias) == template_for(name)
    JudgeConfig(model_name_a="a", model_name_b="b", output="o", dataset=alias)
    SampleConfig(data_path="a", save_path="b", dataset=alias)
    rows = [{"prompt": f"SUBREDDIT: r/s{i % 3}\npost {i}", "response": "x"} for i in range(30)]
    assert sample_records(rows, alias, num=7, seed=1) == sample_records(rows, name, num=7, seed=1)


def test_unknown_names_are_refused_with_the_list():
    for make in (
        lambda: JudgeConfig(model_name_a="a", model_name_b="b", output="o", dataset="sumarize"),
        lambda: SampleConfig(data_path="a", save_path="b", dataset="sumarize"),
    ):
        with pytest.raises(ValueError, match=r"--dataset must be one of: summarize \(alias tldr\)"):
            make()
