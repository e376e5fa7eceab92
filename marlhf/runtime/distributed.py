"""Process-group set-up for the three ways a stage is launched.

- the ``deepspeed`` launcher (multi-GPU, multi-node hostfile): sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*
  and passes ``--local_rank``;
- ``torchrun``: sets the same environment variables;
- a plain ``python`` process (CPU or one GPU): nothing is set, so we set a world of one on a free
  loopback port (without these DeepSpeed tries MPI discovery and fails).

DeepSpeed picks the accelerator (cuda, or cpu with the gloo backend) by itself.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
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
    if acc.device_name() == "cpu" and os.environ["WORLD_SIZE"] == "1":
        with _no_shm_op():
            deepspeed.init_distributed(timeout=datetime.timedelta(seconds=timeout_s))
    else:
        deepspeed.init_distributed(timeout=datetime.timedelta(seconds=timeout_s))


@contextlib.contextmanager
def _no_shm_op():
    """DeepSpeed's CPU backend without its shared-memory all-reduce op: a world of one process has
    nothing to reduce, and loading the op (a probe of every op's compiler support, then a JIT
    build or load under a file lock shared by every process of the machine) is most of a tiny
    run's start-up (seconds idle; minutes while other processes hold the lock)."""
    # the module, not the ``torch`` attribute that ``deepspeed.comm`` also has
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    build = ds_torch.build_shm_op
    ds_torch.build_shm_op = lambda: None
    try:
        yield
    finally:
        ds_torch.build_shm_op = build


def shutdown_distributed() -> None:
    """Tear the process group down once every rank has finished (a no-op when none is set up).

    Without it the group's communication threads are still joinable when the interpreter exits,
    and a rank can abort ("terminate called without an active exception", SIGABRT) after its work
    is done and saved, failing the launcher's run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


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
    """Sum a tensor over ranks (a copy on ``x``'s device; identity in a single process). The
    reduction runs on this process's accelerator: an NCCL-only process group rejects CPU tensors."""
    y = x.detach().clone()
    if world_size() > 1:
        z = y.to(device())
        torch.distributed.all_reduce(z, op=torch.distributed.ReduceOp.SUM)
        y = z.to(x.device)
    return y


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    return all_reduce_sum(x) / world_size()


def all_gather_padded(x: torch.Tensor, pad_value: float | int | bool = 0) -> torch.Tensor:
    """``x`` of every rank concatenated along dim 0, in rank order (``x`` itself in a single process).

    x: (N,) or (N, W, ...) with the same N on every rank; W may differ between ranks and is
    right-padded with ``pad_value`` to the widest. Bool tensors travel as uint8 (not every backend
    gathers bool).
    """
    ws = world_size()
    if ws == 1:
        return x
    y = x.to(torch.uint8) if x.dtype == torch.bool else x
    if y.dim() >= 2:
        width = torch.tensor([y.shape[1]], device=y.device)
        torch.distributed.all_reduce(width, op=torch.distributed.ReduceOp.MAX)
        pad = [0, 0] * (y.dim() - 2) + [0, int(width) - y.shape[1]]
        y = torch.nn.functional.pad(y, pad, value=pad_value)
    parts = [torch.empty_like(y) for _ in range(ws)]
    torch.distributed.all_gather(parts, y.contiguous())
    out = torch.cat(parts)
    return out.bool() if x.dtype == torch.bool else out


def all_gather_object(obj) -> list:
    """A picklable object of every rank, in rank order (``[obj]`` in a single process)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
