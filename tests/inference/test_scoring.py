"""Reward scores of inference (marlhf.inference.scoring): equal to a direct unpadded forward of the
reward model, and a multi-token end-of-conversation token refused."""

import pytest

from marlhf.inference import (
    output_path,
    read_rows,
    run_inference,
)
from marlhf.models.reward_model import load_reward_model
from tests.support.inference import PAIRS, direct_end_score, inference_args


def test_reward_equals_direct_rm_forward(assets, tmp_path):
    run_inference(
        inference_args(assets, tmp_path, save_token_ids=True, batch_size=3, max_new_tokens=8)
    )
    rows = read_rows(output_path(inference_args(assets, tmp_path).inference))
    tok = assets["tok"]
    rm, _ = load_reward_model(assets["rm"])
    assert len(rows) == len(PAIRS)
    for r in rows:
        ids = (
            [tok.bos_token_id]
            + tok(r["prompt"], add_special_tokens=False)["input_ids"]
            + r["response_ids"]
        )
        assert len(r["response_ids"]) == r["response_tokens"]
        assert r["ends_with_eos"] == (r["response_ids"][-1] == tok.eos_token_id)
        assert r["reward"] == pytest.approx(direct_end_score(rm, ids), abs=1e-4)


def test_reward_scoring_refuses_a_multi_token_end_of_conversation_token():
    # the one-token rule on the inference side: "TL;DR" is several tokens of the tiny tokenizer;
    # accepted, it would append ~4 tokens to every response before the reward model read its score
    from types import SimpleNamespace

    from marlhf.config import ModelConfig
    from marlhf.inference.models import eot_ids
    from marlhf.models.load import load_tokenizer

    tok = load_tokenizer(ModelConfig(model_name_or_path="tiny-base"))
    assert eot_ids(tok, SimpleNamespace(end_of_conversation_token=None)) == [tok.eos_token_id]
    with pytest.raises(ValueError, match="not one token of the tokenizer"):
        eot_ids(tok, SimpleNamespace(end_of_conversation_token="TL;DR"))
