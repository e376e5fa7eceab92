"""The guide's multi-node recipe (docs/guide/scale.md) on one machine: two invocations of the recipe's lines (node ranks 0
and 1, one process each, rendezvous on 127.0.0.1, no ssh: the `deepspeed` launcher's ``--no_ssh``)
train MA-PPO with ZeRO-3 (``run_tiny.sh`` in place of ``run_gemma.sh``), are both killed after the
step-2 checkpoint, and the same two commands resume and finish: one metrics row per step, the final
actor saved, and the world size 2 in the log."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marlhf.models.reward_model import RewardModel, save_reward_model
from marlhf.models.zoo import build_tiny
from marlhf.runtime.distributed import free_port
from tests.support.stage_env import stage_env

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def recipe_lines() -> str:
    """The shell lines of the guide's multi-node recipe (the bash block after its marker)."""
    text = (ROOT / "docs" / "guide" / "scale.md").read_text()
    marker = text.index("<!-- multi-node recipe:")
    block = re.search(r"```bash\n(.*?)```", text[marker:], re.DOTALL)
    assert block, "docs/guide/scale.md: no bash block after the multi-node recipe marker"
    return block.group(1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer

    base = tmp_path_factory.mktemp("multinode")
    actor = build_tiny(base / "sft")
    torch.manual_seed(0)
    save_reward_model(RewardModel.from_pretrained(actor), AutoTokenizer.from_pretrained(actor),
                      base / "rm", score_stats={"mean": 0.0, "std": 1.0})  # fmt: skip
    (base / "hosts").write_text("node0 slots=1\nnode1 slots=1\n")
    return base


def _nodes(base: Path, port: int, steps: int) -> list[subprocess.Popen]:
    lines = recipe_lines()
    assert "--no_ssh --node_rank $NODE_RANK" in lines and "run_gemma.sh" in lines
    # the recipe with the tiny script, this machine's paths and small CPU sizes
    script = lines.replace("run_gemma.sh", "run_tiny.sh").replace("29500", str(port))
    script = script.replace("out/mappo out/sft out/rm", f"{base}/out {base}/sft {base}/rm")
    script = script.replace("--hostfile hosts", f"--hostfile {base}/hosts").rstrip("\n")
    script += (" --actor_zero_stage 3 --critic_zero_stage 3 --max_answer_seq_len 8"
               " --per_device_generation_batch_size 4 --per_device_training_batch_size 2"
               f" --max_steps {steps} --save_steps 2 --disable_progress_bar")  # fmt: skip
    procs = []
    for rank in (0, 1):
        env = stage_env(base / "home")
        env.update(NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", NUM_GPUS="1")
        # `python` and `deepspeed` of this interpreter's environment
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        log = open(base / f"node{rank}.log", "a")
        procs.append(subprocess.Popen(["bash", "-c", script], env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
    return procs


def _wait(procs, timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    for p in procs:
        p.wait(timeout=max(1.0, end - time.monotonic()))
    return [p.returncode for p in procs]


def test_two_nodes_train_zero3_are_killed_and_resume(models):
    base = models
    out = base / "out"
    procs = _nodes(base, free_port(), steps=4)
    done = [out / "train_state" / e / "step-2" / "checksums.json" for e in ("actor", "critic")]
    end = time.monotonic() + 1800  # generous: a loaded 2-core machine
    while not all(p.exists() for p in done):
        assert time.monotonic() < end, (base / "node0.log").read_text()[-3000:]
        assert all(p.poll() is None for p in procs), (base / "node0.log").read_text()[-3000:]
        time.sleep(1)
    for p in procs:  # both nodes die at once, launcher and ranks
        os.killpg(p.pid, signal.SIGKILL)
    _wait(procs, 60)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][:2] == [1, 2] and not (out / "actor").exists()
    codes = _wait(_nodes(base, free_port(), steps=4), 1800)
    log = (base / "node0.log").read_text()
    assert codes == [0, 0], log[-3000:] + (base / "node1.log").read_text()[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert (out / "actor" / "config.json").exists()
    assert "world size 2" in log
    assert re.search(r"resum\w* .*step[- ]2", log, re.IGNORECASE), log[-3000:]
