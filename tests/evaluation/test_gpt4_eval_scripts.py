"""The judge scripts run as users run them (docs/guide/evaluation.md) against a local server."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.fake_openai import FakeOpenAI, shown

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-README-flag-secret-9999"


def judge(messages, n):
    a = shown(messages, "A")
    w = "A" if a.startswith("good") else "B"
    if "[Answer A]" in messages[-1]["content"]:
        return f"Reason: r\nFactual accuracy: [[{w}]]\nCoherence: [[{w}]]\nOverall usefulness: [[TIE]]\nVerdict: [[{w}]]"
    return f"Reason: r\nVerdict: [[{w}]]"


def write(tmp_path):
    pa, pb = tmp_path / "a-sampled.jsonl", tmp_path / "b-sampled.jsonl"
    pa.write_text(
        "".join(json.dumps({"prompt": f"Q{i}", "response": f"good {i}"}) + "\n" for i in range(3))
    )
    pb.write_text(
        "".join(json.dumps({"prompt": f"Q{i}", "response": f"bad {i}"}) + "\n" for i in range(3))
    )
    return pa, pb


def run_script(name, args, base_url):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env["OPENAI_BASE_URL"] = base_url
    return subprocess.run(
        [sys.executable, str(ROOT / "evaluation" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_gpt4_eval_readme_command_with_sk(tmp_path):
    pa, pb = write(tmp_path)
    out = tmp_path / "results" / "sumamrize" / "a-v.s.-b.jsonl"
    with FakeOpenAI(judge) as srv:
        p = run_script(
            "gpt4-eval.py",
            [
                "--model_name_a",
                str(pa),
                "--model_name_b",
                str(pb),
                "--dataset",
                "summarize",
                "--output",
                str(out),
                "--sk",
                SECRET,
                "--retry-base-delay",
                "0.001",
            ],
            srv.base_url,
        )
        assert p.returncode == 0, p.stderr
        assert len(srv.requests) == 6
        assert srv.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
    assert (summary["wins"], summary["losses"], summary["win_rate"]) == (3, 0, 1.0)
    assert summary["api_key_source"] == "--sk"
    assert "wins=3" in p.stdout and "judging" in p.stderr  # summary printed, tqdm bar shown
    for text in (
        p.stdout,
        p.stderr,
        out.read_text(),
        out.with_name(out.name + ".summary.json").read_text(),
    ):
        assert SECRET not in text
    for f in (out.parent / ".judge_cache").iterdir():
        assert SECRET not in f.read_text()


def test_webgpt_script_accepts_readme_dataset_flag(tmp_path):
    pa, pb = write(tmp_path)
    out = tmp_path / "gpt4-a-v.s.-b.jsonl"
    with FakeOpenAI(judge) as srv:
        p = run_script(
            "gpt4-webgpt-eval.py",
            [
                "--model_name_a",
                str(pa),
                "--model_name_b",
                str(pb),
                "--dataset",
                "summarize",
                "--output",
                str(out),
                "--sk",
                SECRET,
            ],
            srv.base_url,
        )
    assert p.returncode == 0, p.stderr
    summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
    assert summary["template"] == "webgpt-v1" and summary["wins"] == 3
    assert summary["criteria"]["Overall usefulness"]["ties"] == 3
    assert "Factual accuracy: wins=3" in p.stdout
    assert SECRET not in p.stdout + p.stderr


def test_dry_run_needs_no_key_or_server(tmp_path):
    pa, pb = write(tmp_path)
    p = run_script(
        "gpt4-eval.py",
        [
            "--model_name_a",
            str(pa),
            "--model_name_b",
            str(pb),
            "--output",
            str(tmp_path / "o.jsonl"),
            "--dry-run",
            "--price-input",
            "2",
            "--price-output",
            "4",
        ],
        "http://127.0.0.1:9/v1",
    )
    assert p.returncode == 0, p.stderr
    assert "6 to send" in p.stdout and "cost $" in p.stdout
    assert not (tmp_path / "o.jsonl").exists()


def test_help_of_every_script_renders():
    from marlhf.cli import build_parser
    from marlhf.judge.config import JudgeStage
    from marlhf.judge.human import HumanEvalStage
    from marlhf.judge.sampling import SampleStage

    for stage, flags in (
        (
            JudgeStage,
            ("--model_name_a", "--sk", "--base-url", "--judge-model", "--dry-run", "--limit"),
        ),
        (HumanEvalStage, ("--model_name_a", "--model_a", "--num", "--seed")),
        (SampleStage, ("--data-path", "--save-path", "--dataset", "--num")),
    ):
        text = build_parser(stage).format_help()
        for flag in flags:
            assert flag in text
