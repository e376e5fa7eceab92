import math

import pytest
import torch

from marlhf.config import OptimConfig
from marlhf.runtime.engine import ds_config, lr_lambda, param_groups, warmup_steps
from tests.support.forked import run_python


def test_lr_schedule_by_hand():
    f = lr_lambda("cosine", warmup=2, total=10)
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == 1.0
    assert math.isclose(f(6), 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert math.isclose(f(10), 0.0, abs_tol=1e-12)
    g = lr_lambda("linear", warmup=0, total=4)
    assert [g(s) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_lambda("constant", 0, 5)(3) == 1.0


def test_warmup_steps_precedence():
    assert warmup_steps(OptimConfig(num_warmup_steps=7, warmup_ratio=0.5), 100) == 7
    assert warmup_steps(OptimConfig(warmup_ratio=0.1), 100) == 10


def test_ds_config_shapes():
    cfg = ds_config(
        zero_stage=3,
        dtype="bf16",
        micro_batch_size=4,
        gradient_accumulation_steps=8,
        offload=True,
        optim=OptimConfig(learning_rate=1e-4, weight_decay=0.1),
        on_cpu=True,
    )
    assert cfg["train_batch_size"] == 32
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert cfg["optimizer"]["params"]["torch_adam"] is True
    assert cfg["zero_force_ds_cpu_optimizer"] is False
    inf = ds_config(zero_stage=3, dtype="fp32", micro_batch_size=1, inference=True)
    assert "optimizer" not in inf


def test_param_groups_no_decay_on_norms_and_biases():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    groups = param_groups(m, 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    assert decayed == {id(m[0].weight)}
    assert groups[1]["weight_decay"] == 0.0 and len(groups[1]["params"]) == 3


@pytest.mark.slow  # a DeepSpeed process
def test_single_process_zero0_skips_the_identity_allreduce_bit_for_bit():
    """One process, ZeRO-0, float32: no gradient all-reduce (an identity there), the same weights
    bit for bit as with it, after two optimiser steps that moved them."""
    import json
    import os
    import socket
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", MASTER_PORT=str(port))
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = run_python(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "support" / "engine_allreduce_probe.py")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["skipped"] is False  # enable_backward_allreduce
    assert out["equal"] and out["moved"] > 1e-3, out
