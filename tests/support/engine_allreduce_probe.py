"""For tests/runtime/test_engine.py: one process, ZeRO-0, float32: the engine skips DeepSpeed's gradient
all-reduce, and two steps give bit for bit the weights of the same engine with it on. Prints JSON."""

import copy
import json
import os

import torch

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29561")


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
    from marlhf.runtime.distributed import init_distributed
    from marlhf.runtime.engine import build_train_engine

    init_distributed()  # gloo on the CPU, without the op only inference uses
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
    )  # fmt: skip
    optim = OptimConfig(per_device_train_batch_size=2, learning_rate=1e-2, max_grad_norm=1.0)
    out = {}
    weights = {}
    for name in ("skipped", "on"):
        engine, _ = build_train_engine(
            copy.deepcopy(model), model_cfg=ModelConfig(model_name_or_path="x"),
            ds=DeepSpeedConfig(zero_stage=0), optim=optim, total_steps=10, micro_batch_size=2,
        )  # fmt: skip
        out[name] = engine.enable_backward_allreduce
        if name == "on":
            engine.enable_backward_allreduce = True
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            ids = torch.randint(0, 64, (2, 9), generator=g)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        weights[name] = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    out["equal"] = all(torch.equal(weights["on"][k], v) for k, v in weights["skipped"].items())
    moved = max(float((weights["on"][k] - v).abs().max()) for k, v in model.state_dict().items())
    out["moved"] = moved
    print(json.dumps(out))


if __name__ == "__main__":
    main()
