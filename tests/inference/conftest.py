"""The tiny models and the toy dataset of the inference tests, built once for the package."""

import json

import pytest
import torch

from marlhf.models.reward_model import RewardModel, save_reward_model
from marlhf.models.zoo import build_tiny
from tests.support.inference import CORPUS, PAIRS


@pytest.fixture(scope="package")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference_assets")
    policy = build_tiny(root / "runs" / "run1" / "checkpoints" / "step-100", CORPUS)
    torch.manual_seed(0)
    rm = RewardModel.from_pretrained(policy)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy)
    save_reward_model(rm, tok, root / "rm")
    data = root / "toy"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:  # a dataset directory has a train split too
        f.write(
            json.dumps(
                {"id": 99, "prompt": "POST\nTrain only.\nTL;DR: ", "chosen": "a", "rejected": "b"}
            )
            + "\n"
        )
    with open(data / "eval.jsonl", "w") as f:
        for i, (p, c, r) in enumerate(PAIRS):
            f.write(
                json.dumps({"id": i, "prompt": f"POST\n{p}\nTL;DR: ", "chosen": c, "rejected": r})
                + "\n"
            )
    return {
        "root": root,
        "policy": str(policy),
        "rm": str(root / "rm"),
        "data": str(data),
        "tok": tok,
    }
