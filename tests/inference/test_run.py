"""The inference program end to end on CPU (marlhf.inference.run): schema, output path and summary,
resume, settings, prompt selection, reference scores, gold, code, the macro view, failures; against
independent references (a direct unpadded RM forward, the synthetic gold scorer)."""

import json
import os

import pytest

import marlhf.inference as inference
from marlhf.data.synthetic import gold_score
from marlhf.inference import (
    model_name,
    output_path,
    read_rows,
    run_inference,
)
from marlhf.macro.config import MacroConfig
from marlhf.models.reward_model import load_reward_model
from tests.support.inference import PAIRS, direct_end_score, inference_args


def test_end_to_end_schema_path_and_summary(assets, tmp_path):
    argv = [
        "--proj-path", str(tmp_path), "--dataset", assets["data"], "--model", assets["policy"],
        "--reward-model", assets["rm"], "--max-new-tokens", "6", "--max-prompt-len", "64",
        "--batch-size", "4", "--disable_progress_bar",
    ]  # fmt: skip
    summary = inference.main(argv)
    expected = tmp_path / "results" / "toy" / "temperature=0.8" / "run1-checkpoints-step-100.jsonl"
    assert summary["output"] == str(expected)
    rows = read_rows(str(expected))
    assert len(rows) == len(PAIRS) == summary["n"] == summary["selected"]
    assert len({r["prompt_id"] for r in rows}) == len(rows)
    for r in rows:
        assert {
            "prompt_id",
            "prompt",
            "response",
            "reward",
            "response_tokens",
            "ends_with_eos",
        } <= set(r)
        assert isinstance(r["response"], str) and isinstance(r["reward"], float)
        assert 1 <= r["response_tokens"] <= 6
    # summary against a hand computation over the rows
    rewards = [r["reward"] for r in rows]
    mean = sum(rewards) / len(rewards)
    assert summary["reward_mean"] == pytest.approx(mean)
    assert summary["reward_std"] == pytest.approx(
        (sum((x - mean) ** 2 for x in rewards) / (len(rewards) - 1)) ** 0.5
    )
    assert summary["eos_rate"] == pytest.approx(sum(r["ends_with_eos"] for r in rows) / len(rows))
    on_disk = json.loads(
        (
            tmp_path
            / "results"
            / "toy"
            / "temperature=0.8"
            / "run1-checkpoints-step-100.jsonl.summary.json"
        ).read_text()
    )
    assert on_disk["n"] == len(rows)
    meta = json.loads(open(str(expected) + ".meta.json").read())["settings"]
    assert meta["temperature"] == 0.8 and meta["max_new_tokens"] == 6


def test_variable_length_responses_scored_at_their_eos(assets, tmp_path, monkeypatch):
    """Responses ending at different places (EOS forced into the sampled output at row-dependent
    positions, padded after it like transformers does) are still scored at their own EOS."""
    from transformers import GemmaForCausalLM

    tok = assets["tok"]
    original = GemmaForCausalLM.generate

    def generate_with_early_eos(self, *a, **kw):
        out = original(self, *a, **kw).clone()
        P = kw["input_ids"].shape[1]
        for b in range(out.shape[0]):  # row b stops after b % 4 + 1 tokens (row 3: no EOS)
            if b % 4 != 3:
                stop = P + b % 4
                out[b, stop] = tok.eos_token_id
                out[b, stop + 1 :] = tok.pad_token_id
        return out

    monkeypatch.setattr(GemmaForCausalLM, "generate", generate_with_early_eos)
    args = inference_args(assets, tmp_path, save_token_ids=True, batch_size=4, max_new_tokens=6)
    run_inference(args)
    rows = read_rows(output_path(args.inference))
    rm, _ = load_reward_model(assets["rm"])
    lengths = sorted(r["response_tokens"] for r in rows)
    assert lengths[0] == 1 and lengths[-1] == 6  # truly different lengths in one batch
    for r in rows:
        assert r["ends_with_eos"] == (r["response_tokens"] < 6)
        if r["ends_with_eos"]:
            assert r["response_ids"][-1] == tok.eos_token_id
            assert tok.eos_token_id not in r["response_ids"][:-1]
        ids = (
            [tok.bos_token_id]
            + tok(r["prompt"], add_special_tokens=False)["input_ids"]
            + r["response_ids"]
        )
        assert r["reward"] == pytest.approx(direct_end_score(rm, ids), abs=1e-4)


def test_resume_after_kill_matches_uninterrupted_run(assets, tmp_path):
    killed = inference_args(assets, tmp_path / "a", batch_size=2, max_batches=1)
    run_inference(killed)
    path = output_path(killed.inference)
    first = read_rows(path)
    assert len(first) == 2
    with open(path, "a") as f:  # the kill hit in the middle of writing the next batch
        f.write('{"prompt_id": "local/4", "prompt": "POST')
    summary = run_inference(inference_args(assets, tmp_path / "a", batch_size=2))
    rows = read_rows(path)
    ids = [r["prompt_id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(PAIRS) and summary["complete"]
    assert rows[:2] == first
    # a run that was never interrupted draws the same responses (same batches, same seeds)
    whole = inference_args(assets, tmp_path / "b", batch_size=2)
    run_inference(whole)
    assert read_rows(output_path(whole.inference)) == rows
    # a third run has nothing left to do and leaves the file unchanged
    run_inference(inference_args(assets, tmp_path / "a", batch_size=2))
    assert read_rows(path) == rows


def test_changed_settings_refused_unless_overwrite(assets, tmp_path):
    out = str(tmp_path / "out.jsonl")
    run_inference(inference_args(assets, tmp_path, output=out, max_batches=1))
    with pytest.raises(ValueError, match="temperature"):
        run_inference(inference_args(assets, tmp_path, output=out, temperature=1.0))
    run_inference(
        inference_args(assets, tmp_path, output=out, temperature=1.0, overwrite=True, max_batches=1)
    )
    assert len(read_rows(out)) == 2
    assert json.loads(open(out + ".meta.json").read())["settings"]["temperature"] == 1.0


def test_prompt_selection_independent_of_batch_size(assets, tmp_path):
    a = inference_args(assets, tmp_path / "a", num_samples=4, batch_size=1, max_new_tokens=1)
    b = inference_args(assets, tmp_path / "b", num_samples=4, batch_size=3, max_new_tokens=1)
    run_inference(a)
    run_inference(b)
    ids_a = [r["prompt_id"] for r in read_rows(output_path(a.inference))]
    ids_b = [r["prompt_id"] for r in read_rows(output_path(b.inference))]
    assert ids_a == ids_b and len(set(ids_a)) == 4


def test_prompt_seed_fixes_the_prompts_across_sampling_seeds(assets, tmp_path):
    """With --num-samples, --seed draws the prompts too unless --prompt-seed fixes them: two
    sampling seeds then answer the same prompts (what policy_comparisons pairs up)."""

    def ids(name, **kw):
        args = inference_args(assets, tmp_path / name, num_samples=3, max_new_tokens=1, **kw)
        run_inference(args)
        return [r["prompt_id"] for r in read_rows(output_path(args.inference))]

    assert ids("a", seed=1) != ids("b", seed=2)  # the default: the seed picks the prompts
    fixed = ids("c", seed=1, prompt_seed=5)
    assert fixed == ids("d", seed=2, prompt_seed=5) == ids("e", seed=5)
    with pytest.raises(ValueError, match="prompt_seed"):  # a resumed output keeps its prompts
        run_inference(
            inference_args(assets, tmp_path / "c", num_samples=3, max_new_tokens=1, seed=1)
        )


def test_ref_scores(assets, tmp_path):
    args = inference_args(assets, tmp_path, ref_scores=True)
    summary = run_inference(args)
    path = output_path(args.inference)
    assert os.path.basename(path) == f"ref-scores-{model_name(assets['rm'])}.jsonl"
    rows = read_rows(path)
    tok = assets["tok"]
    rm, _ = load_reward_model(assets["rm"])
    assert len(rows) == len(PAIRS)
    by_prompt = {f"POST\n{p}\nTL;DR: ": (c, r) for p, c, r in PAIRS}
    wins = 0
    for row in rows:
        c, r = by_prompt[row["prompt"]]
        assert (row["chosen_response"], row["rejected_response"], row["response"]) == (c, r, c)
        p_ids = [tok.bos_token_id] + tok(row["prompt"], add_special_tokens=False)["input_ids"]
        for text, key in ((c, "chosen_reward"), (r, "rejected_reward")):
            ids = p_ids + tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert row[key] == pytest.approx(direct_end_score(rm, ids), abs=1e-4)
        assert row["reward"] == row["chosen_reward"]
        wins += row["chosen_reward"] > row["rejected_reward"]
    assert summary["accuracy"] == pytest.approx(wins / len(rows))


def test_synthetic_gold(assets, tmp_path):
    args = inference_args(
        assets, tmp_path, dataset="synthetic", num_samples=3, max_new_tokens=8, max_prompt_len=256
    )
    summary = run_inference(args)
    path = output_path(args.inference)
    assert path == os.path.join(
        str(tmp_path), "results", "synthetic", "temperature=0.8", "run1-checkpoints-step-100.jsonl"
    )
    rows = read_rows(path)
    assert len(rows) == 3
    for r in rows:
        assert r["gold"] == pytest.approx(gold_score(r["prompt"], r["response"]))
    assert summary["gold_mean"] == pytest.approx(sum(r["gold"] for r in rows) / 3)


def test_sampling_without_a_reward_model(assets, tmp_path):
    """Without a reward model the responses are only sampled: a synthetic task's rows carry their
    gold score, the rows of a dataset of one's own no score at all (no `reward`); the sampled
    responses are those of the run with a reward model (the same seed). --ref-scores scores the
    dataset's own responses, so it still needs one."""
    args = inference_args(
        assets,
        tmp_path,
        dataset="synthetic",
        reward_model=None,
        split="train",
        num_samples=3,
        max_new_tokens=8,
        max_prompt_len=256,
        output=str(tmp_path / "train.jsonl"),
    )
    summary = run_inference(args)
    rows = read_rows(str(tmp_path / "train.jsonl"))
    assert len(rows) == 3 and summary["n"] == 3
    for r in rows:
        assert "reward" not in r
        assert r["gold"] == pytest.approx(gold_score(r["prompt"], r["response"]))
    # a dataset of one's own: nothing scores the rows
    own = inference_args(assets, tmp_path, reward_model=None, output=str(tmp_path / "own.jsonl"))
    summary = run_inference(own)
    rows = read_rows(str(tmp_path / "own.jsonl"))
    assert len(rows) == summary["n"] == len(PAIRS)
    assert summary["reward_mean"] is None and "gold_mean" not in summary
    for r in rows:
        assert not {"reward", "gold"} & set(r)
        assert {"prompt_id", "prompt", "response", "response_tokens", "ends_with_eos"} <= set(r)
    scored = inference_args(assets, tmp_path, output=str(tmp_path / "scored.jsonl"))
    run_inference(scored)
    with_rm = {r["prompt_id"]: r for r in read_rows(str(tmp_path / "scored.jsonl"))}
    assert all(with_rm[r["prompt_id"]]["response"] == r["response"] for r in rows)
    with pytest.raises(ValueError, match="needs --reward-model"):
        run_inference(
            inference_args(
                assets, tmp_path, dataset="synthetic", reward_model=None, ref_scores=True
            )
        )


def test_apps_samples_and_pass_at_k(assets, tmp_path):
    data = tmp_path / "apps"
    data.mkdir()
    io = json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})
    for name in ("train.jsonl", "test.jsonl"):
        with open(data / name, "w") as f:
            for pid, q in enumerate(["Read n, print n+1.", "Read n and print n plus one."]):
                row = {
                    "problem_id": pid,
                    "question": q,
                    "input_output": io,
                    "starter_code": "",
                    "solutions": json.dumps(["print(int(input())+1)"]),
                    "difficulty": "introductory",
                }
                f.write(json.dumps(row) + "\n")
    args = inference_args(
        assets,
        tmp_path,
        dataset=str(data),
        reward_model=None,
        n_samples_per_prompt=2,
        max_new_tokens=4,
        pass_k=(1, 2, 5),
        max_prompt_len=128,
    )
    summary = run_inference(args)
    rows = read_rows(output_path(args.inference))
    assert len(rows) == 2
    for r in rows:
        assert len(r["responses"]) == len(r["rewards"]) == 2
        assert all(0.0 <= x <= 1.0 for x in r["rewards"])
        assert r["reward"] == pytest.approx(sum(r["rewards"]) / 2)
    assert "pass@1" in summary and "pass@2" in summary and "pass@5" not in summary


@pytest.mark.parametrize(
    "macro",
    [
        MacroConfig(termination_condition="fixed", ngram=2),
        # the policy's own log-probs of its sampled tokens stand in for the rollout's
        MacroConfig(termination_condition="lowprob", lowprob_threshold=0.9),
    ],
    ids=["fixed", "lowprob"],
)
def test_render_macro_html(assets, tmp_path, macro):
    args = inference_args(assets, tmp_path, render_macro=2, max_new_tokens=6, macro=macro)
    run_inference(args)
    base = output_path(args.inference)[: -len(".jsonl")]
    html = open(base + ".macro.html").read()
    assert html.count('<div class="item">') == 2 and 'class="ma"' in html


def test_failed_run_without_rows_does_not_block_the_corrected_rerun(assets, tmp_path, monkeypatch):
    """A run that failed before writing any row (here: its models failed to load) leaves settings
    that do not refuse the corrected re-run ("refusing to mix results"); a reward-model path that
    does not exist is refused before anything is written."""
    out = str(tmp_path / "out.jsonl")
    with pytest.raises(ValueError, match="no-rm: the directory .* does not exist"):
        run_inference(
            inference_args(assets, tmp_path, output=out, reward_model=str(tmp_path / "no-rm"))
        )
    assert not os.path.exists(out + ".meta.json")

    def fail(*args, **kwargs):
        raise OSError("the disk went away")

    with monkeypatch.context() as m:
        m.setattr("marlhf.inference.run.load_models", fail)
        with pytest.raises(OSError, match="the disk went away"):
            run_inference(inference_args(assets, tmp_path, output=out, temperature=1.0))
    assert os.path.exists(out + ".meta.json") and read_rows(out) == []
    summary = run_inference(inference_args(assets, tmp_path, output=out, max_batches=1))
    assert summary["n"] == 2
    meta = json.loads(open(out + ".meta.json").read())["settings"]
    assert meta["reward_model_path"] == os.path.abspath(assets["rm"])
    # once rows exist, other settings are refused
    with pytest.raises(ValueError, match="refusing to mix results"):
        run_inference(inference_args(assets, tmp_path, output=out, temperature=1.0))


def test_long_task_gold(assets, tmp_path, monkeypatch):
    # the long-horizon tasks are scored by their own gold scorer (it was the TL;DR one, or none)
    from marlhf.data.long_tasks import facts_gold

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    args = inference_args(
        assets,
        tmp_path,
        dataset="synthetic-facts-16",
        num_samples=2,
        max_new_tokens=6,
        max_prompt_len=256,
    )
    summary = run_inference(args)
    rows = read_rows(output_path(args.inference))
    assert len(rows) == 2
    for r in rows:
        assert r["gold"] == pytest.approx(facts_gold(r["prompt"], r["response"]))
    assert "gold_mean" in summary
    with pytest.raises(ValueError, match="--gold_score on"):
        run_inference(inference_args(assets, tmp_path, dataset=assets["data"], gold_score="on"))


def test_csv_dataset_scores_like_jsonl(assets, tmp_path):
    """``marlhf infer --dataset pairs.csv``: the rows of a CSV file (quoted cells with commas and
    line breaks) give the results the same rows give as JSON lines."""
    import csv

    from marlhf.commands import main as marlhf

    rows = [{"id": i, "prompt": f"POST\n{p}, too\nTL;DR: ", "chosen": c, "rejected": r}
            for i, (p, c, r) in enumerate(PAIRS)]  # fmt: skip
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "same.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = []
    for name in ("pairs.csv", "same.jsonl"):
        argv = ["infer", "--dataset", str(tmp_path / name), "--split", "train", "--ref-scores",
                "--proj-path", str(tmp_path), "--reward-model", assets["rm"], "--model",
                assets["policy"], "--max-prompt-len", "64", "--max-new-tokens", "64", "--disable_progress_bar"]  # fmt: skip
        assert marlhf(argv) == 0
        out = tmp_path / "results" / name.split(".")[0] / "temperature=0.8"
        (path,) = out.glob("*.jsonl")
        results.append(sorted(read_rows(str(path)), key=lambda r: r["prompt_id"]))
    csv_rows, json_rows = results
    assert len(csv_rows) == len(PAIRS) and csv_rows == json_rows
    assert {r["prompt"] for r in csv_rows} == {r["prompt"] for r in rows}
