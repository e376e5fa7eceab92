"""The inference flags (marlhf.inference.config) of the original script."""

import pytest

from marlhf.cli import parse_config
from marlhf.inference import InferenceArgs
from marlhf.models.generation import SamplingConfig


def test_cli_flags_of_the_original():
    args = parse_config(InferenceArgs, [
        "--proj-path", "p", "--dataset", "summarize", "--model", "m", "--reward-model", "r",
        "--temperature", "0.8", "--gpu", "0", "--batch-size", "16", "--ref-scores",
        "--pass-k", "1,5,10", "--n-samples-per-prompt", "3", "--ngram", "5", "--render-macro", "4",
    ])  # fmt: skip
    c = args.inference
    assert (c.proj_path, c.reward_model, c.batch_size, c.ref_scores) == ("p", "r", 16, True)
    assert (c.pass_k, c.n_samples_per_prompt, c.render_macro, args.macro.ngram) == (
        (1, 5, 10),
        3,
        4,
        5,
    )
    s = c.sampling
    assert (c.num_samples, c.seed, s.top_k, s.top_p, s.max_answer_seq_len, c.split) == (
        2000,
        1234,
        50,
        1.0,
        512,
        "eval",
    )
    with pytest.raises(ValueError, match="--temperature"):
        SamplingConfig(temperature=0)
