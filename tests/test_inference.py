"""Tests of marlhf/inference/: end to end on CPU with a tiny causal LM and a tiny reward model built
in-process, against independent references (a direct unpadded RM forward, hand-worked summaries,
the synthetic gold scorer)."""

import doctest
import json
import os

import pytest
import torch

import marlhf.inference as inference
from marlhf.cli import parse_config
from marlhf.code_reward import CodeRewardConfig
from marlhf.data.synthetic import gold_score
from marlhf.inference import (
    InferenceArgs,
    InferenceConfig,
    model_name,
    output_path,
    read_rows,
    run_inference,
    select_prompts,
    summarize,
)
from marlhf.macro.config import MacroConfig
from marlhf.reward_model import RewardModel, load_reward_model, save_reward_model
from marlhf.tiny import build_tiny

CORPUS = [
    "POST\nSubreddit: r/cats\nMy cat Tom is ten years old and gained weight.\nTL;DR: ",
    "my cat gained weight and I need diet advice",
    "POST\nSubreddit: r/dogs\nOur dog Rex barks at night when the neighbours come home.\nTL;DR: ",
    "dog barks at night",
    "print(int(input()) + 1)",
] * 10

PAIRS = [
    ("My cat Tom gained weight.", "cat gained weight", "dog barks"),
    ("Our dog Rex barks at night.", "dog barks at night", "my cat is old"),
    ("The neighbours come home late.", "neighbours late", "cat Tom"),
    ("Tom is ten years old.", "Tom is ten", "Rex barks"),
    ("I need diet advice for my cat.", "diet advice for cat", "night barks"),
    ("Rex and Tom are friends.", "Rex and Tom friends", "diet"),
]


@pytest.fixture(scope="module")
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


def _args(assets, tmp_path, **kw) -> InferenceArgs:
    base = dict(
        proj_path=str(tmp_path),
        dataset=assets["data"],
        model=assets["policy"],
        reward_model=assets["rm"],
        max_new_tokens=6,
        max_prompt_len=64,
        batch_size=2,
        disable_progress_bar=True,
    )
    base.update(kw)
    macro = base.pop("macro", MacroConfig())
    return InferenceArgs(InferenceConfig(**base), macro, CodeRewardConfig())


def _direct_end_score(rm, ids: list[int]) -> float:
    """Independent reference: one unpadded sequence, the RM's value at its last token."""
    x = torch.tensor([ids])
    with torch.no_grad():
        return float(rm(x, torch.ones_like(x))[0, -1])


def test_doctests():
    import importlib
    import pkgutil

    assert doctest.testmod(inference, raise_on_error=False).failed == 0
    attempted = 0
    for info in pkgutil.iter_modules(inference.__path__):  # the package's modules have doctests too
        mod = importlib.import_module(f"marlhf.inference.{info.name}")
        res = doctest.testmod(mod, raise_on_error=False)
        assert res.failed == 0, info.name
        attempted += res.attempted
    assert attempted >= 6  # select_prompts, left_pad


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


def test_reward_equals_direct_rm_forward(assets, tmp_path):
    run_inference(_args(assets, tmp_path, save_token_ids=True, batch_size=3, max_new_tokens=8))
    rows = read_rows(output_path(_args(assets, tmp_path).inference))
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
        assert r["reward"] == pytest.approx(_direct_end_score(rm, ids), abs=1e-4)


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
    args = _args(assets, tmp_path, save_token_ids=True, batch_size=4, max_new_tokens=6)
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
        assert r["reward"] == pytest.approx(_direct_end_score(rm, ids), abs=1e-4)


def test_resume_after_kill_matches_uninterrupted_run(assets, tmp_path):
    killed = _args(assets, tmp_path / "a", batch_size=2, max_batches=1)
    run_inference(killed)
    path = output_path(killed.inference)
    first = read_rows(path)
    assert len(first) == 2
    with open(path, "a") as f:  # the kill hit in the middle of writing the next batch
        f.write('{"prompt_id": "local/4", "prompt": "POST')
    summary = run_inference(_args(assets, tmp_path / "a", batch_size=2))
    rows = read_rows(path)
    ids = [r["prompt_id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(PAIRS) and summary["complete"]
    assert rows[:2] == first
    # a run that was never interrupted draws the same responses (same batches, same seeds)
    whole = _args(assets, tmp_path / "b", batch_size=2)
    run_inference(whole)
    assert read_rows(output_path(whole.inference)) == rows
    # a third run has nothing left to do and leaves the file unchanged
    run_inference(_args(assets, tmp_path / "a", batch_size=2))
    assert read_rows(path) == rows


def test_changed_settings_refused_unless_overwrite(assets, tmp_path):
    out = str(tmp_path / "out.jsonl")
    run_inference(_args(assets, tmp_path, output=out, max_batches=1))
    with pytest.raises(ValueError, match="temperature"):
        run_inference(_args(assets, tmp_path, output=out, temperature=1.0))
    run_inference(
        _args(assets, tmp_path, output=out, temperature=1.0, overwrite=True, max_batches=1)
    )
    assert len(read_rows(out)) == 2
    assert json.loads(open(out + ".meta.json").read())["settings"]["temperature"] == 1.0


def test_prompt_selection_independent_of_batch_size(assets, tmp_path):
    a = _args(assets, tmp_path / "a", num_samples=4, batch_size=1, max_new_tokens=1)
    b = _args(assets, tmp_path / "b", num_samples=4, batch_size=3, max_new_tokens=1)
    run_inference(a)
    run_inference(b)
    ids_a = [r["prompt_id"] for r in read_rows(output_path(a.inference))]
    ids_b = [r["prompt_id"] for r in read_rows(output_path(b.inference))]
    assert ids_a == ids_b and len(set(ids_a)) == 4


def test_prompt_seed_fixes_the_prompts_across_sampling_seeds(assets, tmp_path):
    """With --num-samples, --seed draws the prompts too unless --prompt-seed fixes them: two
    sampling seeds then answer the same prompts (what policy_comparisons pairs up)."""

    def ids(name, **kw):
        args = _args(assets, tmp_path / name, num_samples=3, max_new_tokens=1, **kw)
        run_inference(args)
        return [r["prompt_id"] for r in read_rows(output_path(args.inference))]

    assert ids("a", seed=1) != ids("b", seed=2)  # the default: the seed picks the prompts
    fixed = ids("c", seed=1, prompt_seed=5)
    assert fixed == ids("d", seed=2, prompt_seed=5) == ids("e", seed=5)
    with pytest.raises(ValueError, match="prompt_seed"):  # a resumed output keeps its prompts
        run_inference(_args(assets, tmp_path / "c", num_samples=3, max_new_tokens=1, seed=1))


def test_select_prompts_reference():
    import hashlib
    from types import SimpleNamespace

    exs = [SimpleNamespace(prompt_id=f"d/{i % 7}", n=i) for i in range(20)]  # duplicates
    got = select_prompts(exs, 3, seed=1234)
    ref = sorted(
        {f"d/{i}" for i in range(7)}, key=lambda p: hashlib.sha256(f"1234:{p}".encode()).hexdigest()
    )[:3]
    assert [e.prompt_id for e in got] == ref
    assert all(e.n < 7 for e in got)  # first occurrence kept
    assert len(select_prompts(exs, 0, seed=1)) == 7


def test_ref_scores(assets, tmp_path):
    args = _args(assets, tmp_path, ref_scores=True)
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
            assert row[key] == pytest.approx(_direct_end_score(rm, ids), abs=1e-4)
        assert row["reward"] == row["chosen_reward"]
        wins += row["chosen_reward"] > row["rejected_reward"]
    assert summary["accuracy"] == pytest.approx(wins / len(rows))


def test_synthetic_gold(assets, tmp_path):
    args = _args(
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


def test_synthetic_answers_without_a_reward_model(assets, tmp_path):
    """Sampling a synthetic task's train prompts for labelling needs no RM (gold scores them);
    other datasets still require one, and so does --ref-scores."""
    args = _args(
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
        assert r["reward"] is None
        assert r["gold"] == pytest.approx(gold_score(r["prompt"], r["response"]))
    with pytest.raises(ValueError, match="--reward-model is required"):
        run_inference(_args(assets, tmp_path, reward_model=None))
    with pytest.raises(ValueError, match="needs --reward-model"):
        run_inference(
            _args(assets, tmp_path, dataset="synthetic", reward_model=None, ref_scores=True)
        )


def test_output_path_layout():
    cfg = InferenceConfig(
        proj_path="/p", dataset="summarize", model="/x/run1/checkpoints/step-100", temperature=0.7
    )
    assert (
        output_path(cfg) == "/p/results/summarize/temperature=0.7/run1-checkpoints-step-100.jsonl"
    )
    other = InferenceConfig(
        proj_path="/p", dataset="summarize", model="/x/run1/checkpoints/step-200", temperature=0.7
    )
    assert output_path(other) != output_path(cfg)
    assert model_name("/x/run1/actor/") == "x-run1-actor"
    assert output_path(InferenceConfig(output="/o/f.jsonl")) == "/o/f.jsonl"


def test_summary_hand_worked():
    rows = [
        {"prompt_id": "a", "reward": 1.0, "response_tokens": 2, "ends_with_eos": True},
        {"prompt_id": "b", "reward": 2.0, "response_tokens": 4, "ends_with_eos": False},
        {"prompt_id": "c", "reward": 3.0, "response_tokens": 6, "ends_with_eos": True},
    ]
    s = summarize(rows)
    assert (s["n"], s["reward_mean"], s["reward_std"], s["response_tokens_mean"]) == (
        3,
        2.0,
        1.0,
        4.0,
    )
    assert s["eos_rate"] == pytest.approx(2 / 3)
    code = [
        {"prompt_id": "a", "reward": 0.4, "rewards": [1, 1, 0, 0, 0], "n_correct": 2},
        {"prompt_id": "b", "reward": 0.0, "rewards": [0, 0, 0, 0, 0], "n_correct": 0},
    ]
    s = summarize(code, pass_k=(1, 2, 5))
    # pass@k = 1 - C(n-c, k) / C(n, k): (2/5 + 0)/2; (1 - 3/10 + 0)/2; (1 + 0)/2
    assert s["pass@1"] == pytest.approx(0.2)
    assert s["pass@2"] == pytest.approx(0.35)
    assert s["pass@5"] == pytest.approx(0.5)


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
    args = _args(
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
    args = _args(assets, tmp_path, render_macro=2, max_new_tokens=6, macro=macro)
    run_inference(args)
    base = output_path(args.inference)[: -len(".jsonl")]
    html = open(base + ".macro.html").read()
    assert html.count('<div class="item">') == 2 and 'class="ma"' in html


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
    assert (c.num_samples, c.seed, c.top_k, c.top_p, c.max_new_tokens, c.split) == (
        2000,
        1234,
        50,
        1.0,
        512,
        "eval",
    )
    with pytest.raises(ValueError, match="--temperature"):
        InferenceConfig(temperature=0)


def test_output_naming_rule(tmp_path, monkeypatch):
    """#13.30: one naming rule. Models under --proj-path are named by their whole path relative to it
    (old: the last three components, so `runs/llama/sft` kept `runs` and `runs/llama/mappo_n5/actor`
    lost it); a local data file names the results directory by its stem, not `webgpt.jsonl/`."""
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


def test_failed_run_without_rows_does_not_block_the_corrected_rerun(assets, tmp_path):
    """#13.31: a run that failed before writing any row (here: a reward-model path that does not
    exist) left settings that refused the corrected re-run ("refusing to mix results")."""
    out = str(tmp_path / "out.jsonl")
    with pytest.raises(FileNotFoundError, match="not a reward-model directory"):
        run_inference(_args(assets, tmp_path, output=out, reward_model=str(tmp_path / "no-rm")))
    assert os.path.exists(out + ".meta.json") and read_rows(out) == []
    summary = run_inference(_args(assets, tmp_path, output=out, max_batches=1))
    assert summary["n"] == 2
    meta = json.loads(open(out + ".meta.json").read())["settings"]
    assert meta["reward_model_path"] == os.path.abspath(assets["rm"])
    # once rows exist, other settings are refused as before
    with pytest.raises(ValueError, match="refusing to mix results"):
        run_inference(_args(assets, tmp_path, output=out, temperature=1.0))


def test_corrupt_result_line_names_line_and_column(tmp_path):
    """#13.27 for result files read by inference: the JSON error keeps its column."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_id": "a"}\n{"prompt_id": "b", "response": "x\ty"}\n')
    with pytest.raises(
        ValueError, match=r"r\.jsonl line 2: not valid JSON at column 34 \(Invalid control"
    ):
        read_rows(str(path))


def test_reward_scoring_refuses_a_multi_token_end_of_conversation_token():
    # issue 13 item 9 on the inference side: "TL;DR" is several tokens of the tiny tokenizer; it was
    # appended as ~4 tokens to every response before the reward model read its score
    from types import SimpleNamespace

    from marlhf.config import ModelConfig
    from marlhf.inference.models import eot_ids
    from marlhf.models import load_tokenizer

    tok = load_tokenizer(ModelConfig(model_name_or_path="tiny-base"))
    assert eot_ids(tok, SimpleNamespace(end_of_conversation_token=None)) == [tok.eos_token_id]
    with pytest.raises(ValueError, match="not one token of the tokenizer"):
        eot_ids(tok, SimpleNamespace(end_of_conversation_token="TL;DR"))


def test_long_task_gold(assets, tmp_path, monkeypatch):
    # the long-horizon tasks are scored by their own gold scorer (it was the TL;DR one, or none)
    from marlhf.data.long_tasks import facts_gold

    monkeypatch.setenv("MARLHF_HOME", str(tmp_path / "home"))
    args = _args(
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
        run_inference(_args(assets, tmp_path, dataset=assets["data"], gold_score="on"))
