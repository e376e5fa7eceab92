"""The demo's comparison report: intervals, paired gains, the off-format opener share and the RM's
held-out quality, checked against hand-worked values and plain re-computations."""

import json
import math
import random
import statistics

import pytest

from marlhf.pipeline import report


def test_first_word_reads_words_like_the_gold_scorer():
    assert report.first_word("My sister borrowed my car") == "my"
    assert report.first_word("\n  3 my dog") == "3"
    assert report.first_word("tl;dr: my dog") == "tl"
    assert report.first_word("   ...  ") == ""


def test_off_opener_share_counts_junk_and_empty_answers():
    answers = ["my dog ate it", "My cat hid", "so my dog", "tldr my dog", "", "3"]
    assert report.off_opener_share(answers) == pytest.approx(4 / 6)
    assert report.off_opener_share(["so it", "so"], opener="so") == 0.0
    assert math.isnan(report.off_opener_share([]))


def test_paired_gain_matches_prompts_by_id_not_by_position():
    base = [{"prompt_id": f"p{i}", "gold": float(i)} for i in range(6)]
    # reversed order, one prompt missing, one without gold
    rows = [{"prompt_id": f"p{i}", "gold": i + (0.5 if i % 2 else 1.5)} for i in range(5)][::-1]
    rows[0]["gold"] = None
    mean, lo, hi, n = report.paired_gain(rows, base)
    diffs = [1.5, 0.5, 1.5, 0.5]  # p0..p3 (p4 has no gold, p5 no answer)
    assert n == 4
    assert mean == pytest.approx(statistics.fmean(diffs))
    assert 0.5 <= lo <= mean <= hi <= 1.5


def test_paired_gain_interval_excludes_zero_only_for_a_real_shift():
    rng = random.Random(1)
    base = [{"prompt_id": i, "gold": rng.gauss(0, 1)} for i in range(128)]
    shifted = [
        {"prompt_id": r["prompt_id"], "gold": r["gold"] + 0.3 + rng.gauss(0, 0.5)} for r in base
    ]
    noise = [{"prompt_id": r["prompt_id"], "gold": r["gold"] + rng.gauss(0, 0.5)} for r in base]
    assert report.paired_gain(shifted, base)[1] > 0.1
    _, lo, hi, _ = report.paired_gain(noise, base)
    assert lo < 0.05 and hi > -0.05 and hi - lo < 0.25


def test_rm_heldout_quality_counts_ties_and_the_gold_order():
    rows = [
        # RM right, label agrees with gold
        {"chosen_reward": 1.0, "rejected_reward": 0.0, "chosen_gold": 0.9, "rejected_gold": 0.1},
        # RM wrong against the label, right against gold (the label is noisy)
        {"chosen_reward": 0.0, "rejected_reward": 1.0, "chosen_gold": 0.1, "rejected_gold": 0.9},
        # RM tie; gold tie (left out of the gold figures)
        {"chosen_reward": 0.5, "rejected_reward": 0.5, "chosen_gold": 0.3, "rejected_gold": 0.3},
    ]
    q = report.rm_heldout_quality(rows)
    assert q["pairs"] == 3
    assert q["accuracy_vs_labels"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert q["accuracy_vs_gold_order"] == pytest.approx(1.0)
    assert q["labels_vs_gold_order"] == pytest.approx(0.5)


def _result_rows(golds: list[float], answers: list[str]) -> list[dict]:
    return [
        {
            "prompt_id": f"p{i}",
            "response": a,
            "reward": g / 2,
            "gold": g,
            "response_tokens": len(a.split()),
            "ends_with_eos": True,
        }
        for i, (g, a) in enumerate(zip(golds, answers, strict=True))
    ]


def test_write_report_shows_intervals_gains_and_openers(tmp_path):
    rng = random.Random(2)
    n = 40
    sft = [rng.gauss(-0.5, 0.5) for _ in range(n)]
    files = {
        "sft": _result_rows(sft, ["my dog ate it"] * n),
        "ppo": _result_rows([g + 0.4 for g in sft], ["my dog ate it"] * (n - 10) + ["tldr"] * 10),
        "mappo": _result_rows([g - 0.2 for g in sft], ["so my dog"] * n),
    }
    results = {}
    for name, rows in files.items():
        results[name] = tmp_path / f"{name}.jsonl"
        results[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    ref = tmp_path / "ref.jsonl"
    ref.write_text(
        json.dumps(
            {
                "prompt_id": "q",
                "chosen_reward": 1,
                "rejected_reward": 0,
                "chosen_gold": 1,
                "rejected_gold": 0,
            }
        )
        + "\n"
    )
    path = report.write_report(
        tmp_path, results, {}, ngram=5, ref_scores=ref, timings={"sft": 12.0, "rm": None}
    )
    text = path.read_text()
    assert "| ppo | 40 |" in text and "+0.400 [+0.400, +0.400]" in text
    assert "-0.200 [-0.200, -0.200]" in text
    assert "| 25% |" in text and "| 100% |" in text and "| 0% |" in text
    assert "held-out pairwise accuracy: 1.000" in text
    assert "Pearson r of its score with gold on the SFT policy's answers above: 1.000" in text
    assert "sft 12 s" in text and "skipped, already done: rm" in text
    figures = json.loads((tmp_path / "report.json").read_text())
    assert figures["policies"]["ppo"]["gain"][0] == pytest.approx(0.4)
    assert figures["policies"]["ppo"]["off_opener"] == pytest.approx(0.25)
    assert figures["reward_model"]["accuracy_vs_labels"] == 1.0


def test_doctests():
    import doctest

    assert doctest.testmod(report).failed == 0


VERDICT_POST = (
    "POST\nSubreddit: r/AmItheAsshole\nI lost the tickets. My sister borrowed my car. "
    "Then I broke the lamp.\nTL;DR: "
)  # two of the poster's misdeeds against one of the sister's: the right verdict blames the poster


def test_right_verdict_share_reads_the_opening_fact():
    rows = [
        {"prompt": VERDICT_POST, "response": "i lost the tickets and i broke the lamp"},
        {"prompt": VERDICT_POST, "response": "i broke the lamp and my sister borrowed my car"},
        {"prompt": VERDICT_POST, "response": "my sister borrowed my car and i lost the tickets"},
        {"prompt": VERDICT_POST, "response": ""},
    ]
    assert report.right_verdict_share(rows) == pytest.approx(2 / 4)
    assert math.isnan(report.right_verdict_share([]))


def test_mappo_vs_ppo_pairs_gold_and_counts_wins(tmp_path):
    ppo = [{"prompt_id": i, "gold": float(i), "reward": 0.0} for i in range(4)]
    mappo = [{"prompt_id": i, "gold": i + d, "reward": d} for i, d in enumerate([1, 1, 0, -1])]
    pairwise = report.mappo_vs_ppo({"ppo": ppo, "mappo": mappo})
    assert pairwise["gold_gain"][0] == pytest.approx(0.25) and pairwise["gold_gain"][3] == 4
    assert pairwise["gold_win_rate"]["wins_ties_losses"] == [2, 1, 1]
    assert pairwise["gold_win_rate"]["rate"] == pytest.approx((2 + 0.5) / 4)
    assert report.mappo_vs_ppo({"ppo": ppo}) == {}


def test_write_report_on_the_verdict_task_shows_right_verdicts(tmp_path):
    answers = {
        "sft": ["i lost the tickets and i broke the lamp", "my sister borrowed my car"],
        "ppo": ["my sister borrowed my car", "my sister borrowed my car"],
        "mappo": ["i lost the tickets", "i broke the lamp"],
    }
    golds = {"sft": [1.5, 0.0], "ppo": [0.0, 0.0], "mappo": [1.0, 1.0]}
    results = {}
    for name, texts in answers.items():
        rows = [
            {"prompt_id": i, "prompt": VERDICT_POST, "response": t, "gold": g, "reward": g,
             "response_tokens": 8, "ends_with_eos": True}
            for i, (t, g) in enumerate(zip(texts, golds[name], strict=True))
        ]  # fmt: skip
        results[name] = tmp_path / f"{name}.jsonl"
        results[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = report.write_report(
        tmp_path, results, {}, ngram=10, task="synthetic-verdict-64", cpu_s=95.4, threads=2,
        timings={"sft": 12.0},
    )  # fmt: skip
    text = path.read_text()
    assert "| right verdicts |" in text and "openers" not in text
    assert "| 50% |" in text and "| 0% |" in text and "| 100% |" in text
    assert "Δ gold, MA-PPO − PPO (paired by prompt, 95 % bootstrap CI): +1.000" in text
    assert "CPU time of these stages: 95 s (2 threads)" in text
    figures = json.loads((tmp_path / "report.json").read_text())
    assert figures["task"] == "synthetic-verdict-64"
    assert figures["policies"]["mappo"]["right_verdict"] == 1.0
    assert figures["mappo_vs_ppo"]["gold_gain"][0] == pytest.approx(1.0)
