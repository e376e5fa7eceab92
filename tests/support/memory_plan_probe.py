"""For tests/test_memory_plan.py: one process measures what a DeepSpeed training engine adds to its
resident memory over the model's own weights, for one dtype and ZeRO stage given on the command
line, and prints JSON with the plan's figure for the same engine.

The measure is the resident set (Linux /proc) at the moment the plan describes: the entry of the
inner optimizer's second step, when the gradients (in every precision the engine keeps), the master
weights and both Adam moments are all allocated. Before each reading glibc hands its freed pages
back (``malloc_trim``), so memory that was freed but kept by the allocator (which varies from
machine to machine) does not count; a first forward and backward of the bare model before the
baseline loads the kernels' libraries, so their pages do not count either."""

import ctypes
import gc
import json
import os
import sys

import torch

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29565")
_LIBC = ctypes.CDLL("libc.so.6")


def live_rss_mb() -> float:
    """The current resident set after the allocator returned its free pages, MiB."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def inner_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrappers (fp16/bf16, ZeRO)."""
    opt = engine.optimizer
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt


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
    model(input_ids=ids, labels=ids).loss.backward()  # the kernels' libraries, loaded
    model.zero_grad(set_to_none=True)
    before = live_rss_mb()  # the weights are resident
    optim = OptimConfig(per_device_train_batch_size=1, learning_rate=1e-4)
    engine, _ = build_train_engine(
        model, model_cfg=ModelConfig(model_name_or_path="x", dtype=dtype),
        ds=DeepSpeedConfig(zero_stage=stage), optim=optim, total_steps=10, micro_batch_size=1,
    )  # fmt: skip
    readings: list[list[float]] = []  # per engine step: one per inner optimizer step (group)
    inner_optimizer(engine).register_step_pre_hook(
        lambda *_: readings[-1].append(live_rss_mb() - before)
    )
    for _ in range(2):  # the moments are allocated in the first step
        readings.append([])
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    plan = engine_memory(model_shape(cfg), EngineSetup(dtype, stage), 1)
    states = (plan["gradients"] + plan["optimizer"]) / 2**20
    print(json.dumps({"measured_mb": max(readings[-1]), "planned_mb": states,
                      "weights_mb": plan["weights"] / 2**20}))  # fmt: skip


if __name__ == "__main__":
    main()
