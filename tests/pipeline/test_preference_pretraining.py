"""K-wise preference-model pretraining (marlhf/pipeline/preference_pretraining.py) and its generated groups."""

import itertools
import json
import math

import pytest
import torch

from marlhf.data import synthetic
from marlhf.models import zoo
from marlhf.pipeline import preference_pretraining as pmp


def test_kwise_bt_loss_matches_a_loop_over_pairs():
    torch.manual_seed(0)
    scores = torch.randn(7)
    pairs = torch.tensor(
        [(i, j) if (i + j) % 2 else (j, i) for i, j in itertools.combinations(range(7), 2)]
    )
    loss, acc = pmp.kwise_bt_loss(scores, pairs)
    ref = [
        math.log1p(math.exp(-(float(scores[w]) - float(scores[lo])))) for w, lo in pairs.tolist()
    ]
    assert float(loss) == pytest.approx(sum(ref) / len(ref), rel=1e-6)
    right = [float(scores[w]) > float(scores[lo]) for w, lo in pairs.tolist()]
    assert float(acc) == pytest.approx(sum(right) / len(right))
    with pytest.raises(ValueError, match=r"\(P, 2\)"):
        pmp.kwise_bt_loss(scores, pairs.T)


def test_groups_hold_every_pair_once_labelled_by_bradley_terry_on_gold():
    groups = synthetic.generate_groups(400, seed=3)
    assert groups == synthetic.generate_groups(400, seed=3)
    agree, expected = [], []
    for g in groups:
        n = len(g["texts"])
        assert len(set(g["texts"])) == n and set(g["kinds"]) <= set(synthetic.KINDS)
        assert sorted(tuple(sorted(p)) for p in g["pairs"]) == list(
            itertools.combinations(range(n), 2)
        )
        gold = [synthetic.gold_score(g["prompt"], t) for t in g["texts"]]
        for w, lo in g["pairs"]:
            if gold[w] != gold[lo]:
                agree.append(gold[w] > gold[lo])
                expected.append(1 / (1 + math.exp(-synthetic.BETA * abs(gold[w] - gold[lo]))))
    # the labels' agreement with gold is the Bradley-Terry expectation (a few thousand pairs)
    assert sum(agree) / len(agree) == pytest.approx(sum(expected) / len(expected), abs=0.02)
    few = synthetic.generate_groups(20, seed=3, kinds=("complete", "missing"))
    assert all(set(g["kinds"]) <= {"complete", "missing"} for g in few)
    with pytest.raises(ValueError, match="unknown kinds"):
        synthetic.generate_groups(1, seed=0, kinds=("complete", "perfect"))


def test_group_batch_encodes_like_the_reward_stage(tmp_path):
    from transformers import AutoTokenizer

    from marlhf.data.config import DataConfig
    from marlhf.data.tokenize import build_pair_dataset
    from marlhf.models.zoo import bundled_corpus_path, ensure_tiny_base

    tok = AutoTokenizer.from_pretrained(ensure_tiny_base())
    row = json.loads(open(bundled_corpus_path()).readline())
    cfg = DataConfig(
        data_path=(str(bundled_corpus_path()),),
        data_split="1,0,0",
        data_output_path=str(tmp_path),
        max_seq_len=192,
        max_samples=1,
    )
    ref = build_pair_dataset(cfg, tok, "train", seed=0, phase=1)[0]
    texts = [s["text"] for s in row["summaries"]]
    chosen, rejected = texts[row["choice"]], texts[1 - row["choice"]]
    group = {"prompt": synthetic.prompt_of(row), "texts": [rejected, chosen], "pairs": [(1, 0)]}
    ids, mask, pairs = pmp.group_batch(tok, [group, group])
    assert ids.shape[0] == 4 and pairs.tolist() == [[1, 0], [3, 2]]
    assert ids[1, : int(mask[1].sum())].tolist() == list(ref["chosen_input_ids"])
    assert ids[2, : int(mask[2].sum())].tolist() == list(ref["rejected_input_ids"])
    assert mask[0].sum() + mask[1].sum() > 0 and int(mask[:, -1].sum()) >= 1


def test_pretrain_lowers_the_loss_on_a_fixed_group(monkeypatch):
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import RewardModel, end_scores
    from marlhf.models.zoo import ensure_tiny_base

    tok = AutoTokenizer.from_pretrained(ensure_tiny_base())
    torch.manual_seed(0)
    model = RewardModel.from_pretrained(ensure_tiny_base())
    group = synthetic.generate_groups(1, seed=9)[0]
    monkeypatch.setattr(pmp, "generate_groups", lambda n, seed, kinds: [group] * n)
    ids, mask, pairs = pmp.group_batch(tok, [group])

    def loss():
        with torch.no_grad():
            return float(pmp.kwise_bt_loss(end_scores(model(ids, mask), mask), pairs)[0])

    before = loss()
    heldout = [json.loads(line) for line in open(zoo.bundled_corpus_path())][:4]
    records = pmp.pretrain(
        model, tok, [pmp.PMPPhase(synthetic.KINDS, steps=30, lr=1e-3, posts=1)], 0, heldout,
        eval_every=15, log=lambda r: None,
    )  # fmt: skip
    assert [r["step"] for r in records] == [15, 30]
    assert {"accuracy", "gold_accuracy", "train_pair_accuracy", "seconds"} <= set(records[0])
    assert loss() < 0.5 * before


def test_doctests():
    import doctest

    assert doctest.testmod(pmp).failed == 0
    assert doctest.testmod(synthetic).failed == 0


def test_off_task_candidates_are_pmp_only_and_scored_by_gold():
    groups = synthetic.generate_groups(200, seed=4, kinds=synthetic.OFF_TASK_KINDS)
    for g in groups:
        post_words = set(synthetic._read(synthetic._post_text(g["prompt"]))[0])
        for kind, text in zip(g["kinds"], g["texts"], strict=True):
            words, claimed, _ = synthetic._read(text)
            if kind == "salad":  # post words (or "sorry" when it has no filler sentence), no fact
                assert not claimed and set(words) <= post_words | {"sorry"}
                assert synthetic.gold_score(g["prompt"], text) <= 0
            else:
                assert claimed and claimed <= synthetic.post_facts(g["prompt"])
    bundled = synthetic.generate(300, seed=0)
    assert {s["policy"] for r in bundled for s in r["summaries"]} <= set(
        synthetic.POLICIES.values()
    )
