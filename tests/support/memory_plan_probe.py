"""For tests/test_memory_plan.py: one process measures what a DeepSpeed training engine adds to its
resident memory (`resource` peak RSS) over the model's own weights, for one dtype and ZeRO stage
given on the command line, and prints JSON with the plan's figure for the same engine."""

import gc
import json
import os
import sys

import torch

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29565")


def rss_mb() -> float:
    """The current resident set (Linux /proc), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
    from marlhf.pipeline.memory_plan import EngineSetup, engine_memory, model_shape
    from marlhf.runtime.distributed import init_distributed
    from marlhf.runtime.engine import build_train_engine

    dtype, stage = sys.argv[1], int(sys.argv[2])
    init_distributed()  # gloo on the CPU, without the op only inference uses
    cfg = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536,
                      num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    ids = torch.randint(0, 8000, (1, 8))
    gc.collect()
    before = rss_mb()  # the weights are resident
    optim = OptimConfig(per_device_train_batch_size=1, learning_rate=1e-4)
    engine, _ = build_train_engine(
        model, model_cfg=ModelConfig(model_name_or_path="x", dtype=dtype),
        ds=DeepSpeedConfig(zero_stage=stage), optim=optim, total_steps=10, micro_batch_size=1,
    )  # fmt: skip
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    gc.collect()
    after = rss_mb()
    plan = engine_memory(model_shape(cfg), EngineSetup(dtype, stage), 1)
    states = (plan["gradients"] + plan["optimizer"]) / 2**20
    print(json.dumps({"measured_mb": after - before, "planned_mb": states,
                      "weights_mb": plan["weights"] / 2**20}))  # fmt: skip


if __name__ == "__main__":
    main()
