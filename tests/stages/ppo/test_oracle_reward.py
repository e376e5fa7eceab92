"""`--reward_source gold`: the synthetic task's gold score as PPO's sequence reward."""

import pytest
import torch

from marlhf.data.synthetic import gold_score
from marlhf.models.zoo import BASE_DIR
from marlhf.stages.ppo.config import PPOConfig
from marlhf.stages.ppo.rollout import Rollout
from marlhf.stages.ppo.scoring import sequence_scores

PROMPTS = [
    "POST\nSubreddit: r/family\nLast week, my sister borrowed my car. Sorry for the long post.\nTL;DR: ",
    "POST\nSubreddit: r/jobs\nMy boss cancelled our trip. I found out that my coworker lost the keys.\nTL;DR: ",
]


def _rollout(tok, responses: list[str], eos: list[bool], width: int = 24) -> Rollout:
    """Two right-padded responses; a truncated one has no EOS. Junk after EOS must be ignored."""
    rows, masks = [], []
    for text, ends in zip(responses, eos, strict=True):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if ends:
            ids = ids + [tok.eos_token_id]
        valid = len(ids)
        ids = (
            ids + tok(" my dog stole my lunch", add_special_tokens=False)["input_ids"]
        )  # after the end
        ids = (ids + [tok.pad_token_id] * width)[:width]
        rows.append(ids)
        masks.append([i < valid for i in range(width)])
    response_ids = torch.tensor(rows)
    B = len(rows)
    return Rollout(
        sequences=response_ids.clone(),
        attention_mask=torch.ones(B, width, dtype=torch.bool),
        response_start=torch.zeros(B, dtype=torch.long),
        response_ids=response_ids,
        action_mask=torch.tensor(masks),
        ends_with_eos=torch.tensor(eos),
        prompt_ids=["a", "b"],
    )


def test_gold_oracle_scores_each_valid_response_against_its_own_prompt():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BASE_DIR)
    responses = ["my sister borrowed my car", "my boss cancelled our trip and my coworker sold"]
    ro = _rollout(tok, responses, eos=[True, False])
    scores, stats = sequence_scores(
        ro,
        None,
        [{}, {}],
        tok,
        PPOConfig(reward_source="gold"),
        oracle=gold_score,
        prompt_texts=PROMPTS,
    )
    # hand check: the first summary is complete and concise (1.0); the second has one fact right,
    # and claims "coworker sold", a fact the post does not have
    expected = [gold_score(p, r) for p, r in zip(PROMPTS, responses, strict=True)]
    assert expected[0] == 1.0 and expected[1] < 0.5
    assert scores.tolist() == pytest.approx(expected, abs=1e-6)
    assert stats == {}
    # the same responses paired with the other prompts score differently: the prompt is used
    swapped, _ = sequence_scores(
        ro, None, [{}, {}], tok, PPOConfig(), oracle=gold_score, prompt_texts=PROMPTS[::-1]
    )
    assert swapped.tolist() != pytest.approx(expected, abs=1e-3)


def test_oracle_needs_one_prompt_per_response():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BASE_DIR)
    ro = _rollout(tok, ["my sister borrowed my car", "x"], eos=[True, True])
    with pytest.raises(ValueError, match="one prompt text per response"):
        sequence_scores(
            ro, None, [{}, {}], tok, PPOConfig(), oracle=gold_score, prompt_texts=PROMPTS[:1]
        )
