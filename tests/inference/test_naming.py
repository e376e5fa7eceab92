"""Where inference results go (marlhf.inference.naming)."""

import os

from marlhf.inference import (
    InferenceConfig,
    model_name,
    output_path,
)
from tests.support.inference import inference_config


def test_output_path_layout():
    cfg = inference_config(
        proj_path="/p", dataset="summarize", model="/x/run1/checkpoints/step-100", temperature=0.7
    )
    assert (
        output_path(cfg) == "/p/results/summarize/temperature=0.7/run1-checkpoints-step-100.jsonl"
    )
    other = inference_config(
        proj_path="/p", dataset="summarize", model="/x/run1/checkpoints/step-200", temperature=0.7
    )
    assert output_path(other) != output_path(cfg)
    assert model_name("/x/run1/actor/") == "x-run1-actor"
    assert output_path(InferenceConfig(output="/o/f.jsonl")) == "/o/f.jsonl"


def test_output_naming_rule(tmp_path, monkeypatch):
    """One naming rule. Models under --proj-path are named by their whole path relative to it (not
    the last three components, which keep `runs` of `runs/llama/sft` and lose it from
    `runs/llama/mappo_n5/actor`); a local data file names the results directory by its stem, not
    `webgpt.jsonl/`."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "webgpt.jsonl").write_text("")
    names = {}
    for model in ("runs/llama/sft", "runs/llama/mappo_n5/actor"):
        cfg = InferenceConfig(proj_path=str(proj), dataset="hh", model=str(proj / model))
        names[model] = os.path.relpath(output_path(cfg), proj)
    assert names == {
        "runs/llama/sft": "results/hh-rlhf/temperature=0.8/runs-llama-sft.jsonl",
        "runs/llama/mappo_n5/actor": "results/hh-rlhf/temperature=0.8/runs-llama-mappo_n5-actor.jsonl",
    }
    # relative paths resolve against the working directory, as the program opens them
    monkeypatch.chdir(proj)
    cfg = InferenceConfig(
        proj_path=".", dataset="data/webgpt.jsonl", model="runs/llama/mappo_n5/actor"
    )
    assert output_path(cfg) == os.path.join(
        ".", "results", "webgpt", "temperature=0.8", "runs-llama-mappo_n5-actor.jsonl"
    )
    # the same dataset under any of its names gives the same directory
    dirs = {
        output_path(InferenceConfig(proj_path="/p", dataset=d, model="m")).split("/")[3]
        for d in ("summarize", "tldr", "openai/summarize_from_feedback")
    }
    assert dirs == {"summarize"}
    rm = InferenceConfig(
        proj_path=str(proj), reward_model=str(proj / "out" / "rm"), ref_scores=True
    )
    assert os.path.basename(output_path(rm)) == "ref-scores-out-rm.jsonl"
