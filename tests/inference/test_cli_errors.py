"""``marlhf infer`` on data and models of one's own: columns under other names (``--data_columns``,
as the stages read them), lengths beyond a model's context, a model that does not exist or a
policy directory given as the reward model (one ``error:`` line each, status 2, no traceback),
``marlhf preflight infer``, and the tools that read a file sampled without a reward model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from marlhf.inference import read_rows, run_inference
from marlhf.pipeline.preflight import main as preflight_main
from tests.support.inference import PAIRS, inference_args
from tests.support.stage_env import ROOT, stage_env


def _queries(tmp_path):
    """A file whose prompts sit in a column `question` (no known schema)."""
    path = tmp_path / "queries.jsonl"
    with open(path, "w") as f:
        for i, (p, _, _) in enumerate(PAIRS):
            f.write(json.dumps({"qid": i, "question": f"POST\n{p}\nTL;DR: "}) + "\n")
    return path


def test_data_columns(assets, tmp_path):
    path = _queries(tmp_path)
    with pytest.raises(Exception, match=r"no known dataset schema .* --data_columns"):
        run_inference(inference_args(assets, tmp_path, dataset=str(path), split="train"))
    out = tmp_path / "out.jsonl"
    args = inference_args(
        assets, tmp_path, dataset=str(path), split="train", output=str(out), num_samples=0
    )
    args.inference.data.data_columns = ("prompt=question",)
    summary = run_inference(args)
    rows = read_rows(str(out))
    assert summary["n"] == len(rows) == len(PAIRS)
    assert sorted(r["prompt"] for r in rows) == sorted(f"POST\n{p}\nTL;DR: " for p, _, _ in PAIRS)
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())["settings"]
    assert meta["data_columns"] == ["prompt=question"]


def _gpt2(tmp_path, tok):
    """A GPT-2 with 96 learned positions (past them its embedding raises IndexError)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tok), n_positions=96, n_embd=32, n_layer=1, n_head=2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    path = tmp_path / "gpt2"
    GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _infer(tmp_path, *argv):
    cmd = [sys.executable, "-m", "marlhf", "infer", "--disable_progress_bar", *argv]
    return subprocess.run(
        cmd, env=stage_env(tmp_path / "home"), capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )  # fmt: skip


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_errors_are_one_line(assets, tmp_path):
    data = ("--dataset", assets["data"], "--output", str(tmp_path / "o.jsonl"))
    # lengths beyond the context: GPT-2's 96 positions, 64 + 200 asked for
    gpt2 = _gpt2(tmp_path, assets["tok"])
    line = _one_error_line(
        _infer(
            tmp_path,
            "--model_name_or_path",
            str(gpt2),
            "--reward_model_name_or_path",
            assets["rm"],
            "--max_new_tokens",
            "200",
            "--max_prompt_seq_len",
            "64",
            *data,
        )  # fmt: skip
    )
    assert line == (
        f"error: --max_prompt_seq_len 64 + --max_answer_seq_len 200 = 264 positions, more than "
        f"--model_name_or_path {gpt2} takes (n_positions 96 in its config.json): lower them so "
        "that they add up to 96 or less"
    )
    # a policy that does not exist
    missing = tmp_path / "no" / "sft"
    line = _one_error_line(_infer(tmp_path, "--model_name_or_path", str(missing), *data))
    assert line.startswith(f"error: --model_name_or_path {missing}: ") and "does not exist" in line
    # the policy given as the reward model
    line = _one_error_line(
        _infer(
            tmp_path,
            "--model_name_or_path",
            assets["policy"],
            "--reward_model_name_or_path",
            assets["policy"],
            *data,
        )  # fmt: skip
    )
    assert line.startswith(f"error: --reward_model_name_or_path {assets['policy']}: not a reward")
    assert not (tmp_path / "o.jsonl").exists()  # refused before anything is written


def test_preflight_infer(assets, tmp_path, capsys):
    ok = ["--model_name_or_path", assets["policy"], "--reward_model_name_or_path", assets["rm"],
          "--dataset", assets["data"], "--max_prompt_seq_len", "64", "--max_answer_seq_len", "8"]  # fmt: skip
    assert preflight_main(["infer", *ok]) == 0
    capsys.readouterr()
    bad = ["--model_name_or_path", assets["rm"], "--reward_model_name_or_path", assets["policy"],
           "--dataset", str(_queries(tmp_path))]  # fmt: skip
    assert preflight_main(["infer", *bad]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"preflight: --model_name_or_path {assets['rm']}: this is a reward")
    assert err[1].startswith(f"preflight: --reward_model_name_or_path {assets['policy']}: not a")
    assert err[2].startswith(f"preflight: --dataset {tmp_path / 'queries.jsonl'}: no known")
    assert "--data_columns" in err[2] and len(err) == 4
    mapped = [
        *ok[:4],
        "--dataset",
        str(tmp_path / "queries.jsonl"),
        "--data_columns",
        "prompt=question",
        *ok[6:],
    ]
    assert preflight_main(["infer", *mapped]) == 0
    capsys.readouterr()
    long = [*ok[:6], "--max_prompt_seq_len", "500", "--max_answer_seq_len", "100"]
    assert preflight_main(["infer", *long]) == 2
    assert "more than --model_name_or_path" in capsys.readouterr().err


def test_tools_read_a_file_sampled_without_a_reward_model(assets, tmp_path, capsys):
    """`marlhf view`, the judge's pairing and `marlhf compare --results` on rows without scores."""
    from marlhf.inference.view import main as view_main
    from marlhf.judge.pairing import align_results, load_results
    from marlhf.pipeline.compare import main as compare_main

    paths = []
    for seed in (1, 2):
        out = tmp_path / f"s{seed}.jsonl"
        run_inference(
            inference_args(assets, tmp_path, reward_model=None, seed=seed, output=str(out))
        )
        paths.append(str(out))
    assert all("reward" not in r for r in read_rows(paths[0]))
    shown = view_main([paths[0], "--html", "none", "--num", "2"])
    assert len(shown[0]["items"]) == 2 and all(it["reward"] is None for it in shown[0]["items"])
    pairs = align_results(*paths)
    assert len(pairs) == len(PAIRS) and {p.prompt for p in pairs} == {
        r["prompt"] for r in load_results(paths[0])
    }
    capsys.readouterr()
    assert compare_main(["--results", *paths, "--output", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert "no reward model scored them" in err and "marlhf judge" in err
