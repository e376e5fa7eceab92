"""Process-group set-up for the three ways a stage is launched.

- the ``deepspeed`` launcher (multi-GPU, multi-node hostfile): sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*
  and passes ``--local_rank``;
- ``torchrun``: sets the same environment variables;
- a plain ``python`` process (CPU or one GPU): nothing is set, so we set a world of one on a free
  loopback port (without these DeepSpeed tries MPI discovery and fails).

DeepSpeed picks the accelerator (cuda, or cpu with the gloo backend) by itself.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(local_rank: int = -1, timeout_s: int = 1800) -> None:
    """Initialise ``torch.distributed`` through DeepSpeed (idempotent)."""
    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ["LOCAL_RANK"] = "0"
    if local_rank >= 0:
        os.environ["LOCAL_RANK"] = str(local_rank)
    acc = deepspeed.get_accelerator()
    if acc.device_name() == "cuda":
        acc.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(timeout=datetime.timedelta(seconds=timeout_s))


def rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def device() -> torch.device:
    """The accelerator device of this process (``cpu`` when DeepSpeed runs on CPU)."""
    import deepspeed

    acc = deepspeed.get_accelerator()
    if acc.device_name() == "cpu":
        return torch.device("cpu")
    return torch.device(acc.device_name(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (a copy; identity in a single process)."""
    y = x.detach().clone()
    if world_size() > 1:
        torch.distributed.all_reduce(y, op=torch.distributed.ReduceOp.SUM)
    return y


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    return all_reduce_sum(x) / world_size()
