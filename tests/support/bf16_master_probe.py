"""For tests/test_bf16_fp32.py: one process builds the training engine of each ZeRO stage in bf16
(`marlhf.runtime.engine.build_train_engine`), takes two optimizer steps and prints JSON: the dtypes of the
model's weights and of the torch AdamW's parameters (DeepSpeed's master copy) and moments."""

import json
import os

import torch

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29563")


def inner_optimizer(engine):
    """The torch optimizer under DeepSpeed's wrappers (bf16 / ZeRO)."""
    opt = engine.optimizer
    while hasattr(opt, "optimizer") and opt.optimizer is not opt:
        opt = opt.optimizer
    return opt


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
    from marlhf.runtime.distributed import init_distributed
    from marlhf.runtime.engine import build_train_engine

    init_distributed()  # gloo on the CPU, without the op only inference uses
    optim = OptimConfig(per_device_train_batch_size=2, learning_rate=1e-2, max_grad_norm=1.0)
    out = {}
    for stage in (0, 1, 2, 3):
        torch.manual_seed(0)
        model = LlamaForCausalLM(
            LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1)
        ).to(torch.bfloat16)  # fmt: skip
        engine, _ = build_train_engine(
            model, model_cfg=ModelConfig(model_name_or_path="x", dtype="bf16"),
            ds=DeepSpeedConfig(zero_stage=stage), optim=optim, total_steps=10, micro_batch_size=2,
        )  # fmt: skip
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            ids = torch.randint(0, 64, (2, 9), generator=g)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        opt = inner_optimizer(engine)
        params = [p for group in opt.param_groups for p in group["params"]]
        # ZeRO-3 hands its flat master partitions to the optimizer only inside step()
        params += list(getattr(engine.optimizer, "fp32_partitioned_groups_flat", []))
        moments = [t for p in params for k, t in opt.state[p].items() if k.startswith("exp_avg")]
        out[stage] = {
            "optimizer": type(opt).__name__,
            "module": sorted({str(p.dtype) for p in engine.module.parameters()}),
            "master": sorted({str(p.dtype) for p in params}),
            "moments": sorted({str(t.dtype) for t in moments}),
            "n_moments": len(moments),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
