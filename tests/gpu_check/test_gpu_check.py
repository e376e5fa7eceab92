"""``python -m marlhf.gpu_check`` at CPU size (no GPU here: the embedded tiny model, one step each):
every part runs and writes its JSON and markdown table, and the pipeline runs every stage in bf16
(SFT and the reward model at ZeRO-2, PPO n=1 at ZeRO-2, MA-PPO n=5 at ZeRO-3, GRPO with a LoRA actor,
macro_mc, inference with rewards), each loading the previous runs' checkpoints, with finite losses.
This is the bf16 coverage of every stage on CPU (ZeRO-0 in bf16: tests/pipeline/test_demo_bf16.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = subprocess.run(
        [sys.executable, "-m", "marlhf.gpu_check", "--output_dir", str(out)],
        env=stage_env(out / "home"), cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
def test_every_part_ran_at_cpu_size(check):
    out, result = check
    assert result["ok"] and result["errors"] == {}
    assert result["sizes"]["device"] == "cpu" and result["sizes"]["steps"] == 1
    env = result["environment"]
    assert env["torch"] and env["deepspeed"] and env["transformers"] and env["sdpa"]["math_d64"]
    dec = result["decode"]
    for name in ("hf_generate", "static_eager"):
        assert dec[name]["tokens_per_s"] > 0
    ppo = result["ppo_update"]
    assert ppo["steps"] == 2 and ppo["seconds_per_update"] > 0 and ppo["run"]["ok"]
    assert any(k.startswith("mem/peak_rss_mb/") for k in ppo["peak_mb"])
    mm = result["mismatch"]
    assert mm["dtype"] == "torch.bfloat16" and 0 < mm["rollout/logprob_diff_max"] < 0.5
    table = (out / "gpu_check.md").read_text()
    assert table.startswith("| check | figure | status |") and "FAIL" not in table


@pytest.mark.slow
def test_pipeline_runs_every_stage_in_bf16(check):
    out, result = check
    runs = {r["name"]: r for r in result["pipeline"]}
    expected = ["sft", "rm", "ppo_n1", "mappo_n5_zero3", "grpo_lora", "macro_mc", "inference",
                "reload"]  # fmt: skip
    assert list(runs) == expected
    for name, r in runs.items():
        assert r["ok"] and not r["problems"], (name, r["problems"])
        if name not in ("reload",):
            assert r["peak"]["peak_rss_mb"] > 0, name
    work = out / "runs"
    sft = json.loads((work / "sft" / "run_config.json").read_text())
    assert sft["model"]["dtype"] == "bf16" and sft["ds"]["zero_stage"] == 2
    zeros = {"ppo_n1": 2, "mappo_n5_zero3": 3, "grpo_lora": 2, "macro_mc": 2}
    for name, stage in zeros.items():
        cfg = json.loads((work / name / "run_config.json").read_text())
        models = cfg["models"]
        assert models["shared"]["dtype"] == "bf16" and models["actor"]["ds"]["zero_stage"] == stage
        ds = json.loads((work / name / "ds_config.json").read_text())
        assert ds["actor"]["bf16"] == {"enabled": True}, name
        # the rollout correction is on in bf16 (auto: tis), so the mismatch is logged every step
        assert "rollout/logprob_diff_mean" in runs[name]["metrics"], name
    grpo = json.loads((work / "grpo_lora" / "run_config.json").read_text())
    assert grpo["models"]["actor"]["model"]["lora_dim"] == 16
    assert grpo["ppo"]["advantage_estimator"] == "grpo"
    assert not (work / "grpo_lora" / "critic").exists()  # critic-free
    assert runs["inference"]["metrics"]["rows"] == 8
    for name in ("sft", "rm", *zeros):  # later runs read the models only; the resumable state goes
        model = work / name / ("actor" if name in zeros else "")
        assert (model / "config.json").exists() and not (work / name / "train_state").exists()


def test_parts_run_in_the_order_given_and_each_is_written_when_done(tmp_path, monkeypatch):
    import marlhf.gpu_check as gc
    from marlhf.gpu_check.config import CheckConfig

    calls = []
    monkeypatch.setattr(gc, "rollout_mismatch", lambda *a: calls.append("mismatch") or {"m": 1})
    monkeypatch.setattr(gc, "_load", lambda path, device: object())

    def decode(*a):
        calls.append("decode")
        raise RuntimeError("planted")

    monkeypatch.setattr(gc, "decode_throughput", decode)
    monkeypatch.setattr(gc, "bench_models", lambda *a: None)
    cfg = CheckConfig(output_dir=str(tmp_path), parts=("mismatch", "decode"))
    written = []

    def on_part(result):
        js, md = gc.write(result, tmp_path)
        written.append((sorted(result["part_seconds"]), md.read_text().splitlines()[-1]))

    result = gc.run_check(cfg, on_part=on_part)
    assert calls == ["mismatch", "decode"]
    assert [w[0] for w in written] == [["mismatch"], ["decode", "mismatch"]]
    assert written[0][1].startswith("Part-way:") and "parts done: mismatch" in written[0][1]
    assert result["errors"] == {"decode": "RuntimeError: planted"} and result["ok"] is False
