"""For tests/runtime/test_teardown.py: a stage's life under ``torchrun`` (two ranks, gloo on CPU): a
trainable engine and a frozen one at the ZeRO stage given as the first argument, one forward and
backward, an optimizer step and a gather, then :func:`marlhf.stages.common.run_stage`'s teardown.
Each rank writes ``teardown_rank{RANK}.json`` in the working directory (a file of its own: two ranks'
lines on one shared stdout can interleave): the process group's threads (gloo's, from
``/proc/self/task``) while the stage ran and after ``run_stage`` returned."""

import json
import os
import sys

import torch


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from marlhf.config import DeepSpeedConfig, ModelConfig, OptimConfig
    from marlhf.runtime.distributed import (
        all_gather_object,
        init_distributed,
        process_group_threads,
    )
    from marlhf.runtime.engine import build_eval_engine, build_train_engine
    from marlhf.stages.common import run_stage

    stage = int(sys.argv[1])
    during = []

    def train(cfg) -> None:
        init_distributed()
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1,
        )  # fmt: skip
        engine, _ = build_train_engine(
            LlamaForCausalLM(config), model_cfg=ModelConfig(model_name_or_path="x"),
            ds=DeepSpeedConfig(zero_stage=stage), total_steps=2, micro_batch_size=2,
            optim=OptimConfig(per_device_train_batch_size=2, learning_rate=1e-2),
        )  # fmt: skip
        frozen, _ = build_eval_engine(LlamaForCausalLM(config), dtype="fp32", zero_stage=stage)
        ids = torch.randint(0, 64, (2, 9))
        with torch.no_grad():
            frozen(input_ids=ids)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        all_gather_object(int(os.environ["RANK"]))
        during.extend(process_group_threads())

    run_stage(train, None)
    rank = int(os.environ["RANK"])
    report = {"rank": rank, "during": during, "after": process_group_threads()}
    with open(f"teardown_rank{rank}.json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
