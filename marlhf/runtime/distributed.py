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
import gc
import importlib
import logging
import os
import socket
import sys
import weakref

import torch
import torch._appdirs

log = logging.getLogger(__name__)

# the DeepSpeed engines built in this process (:mod:`marlhf.runtime.engine`), released at teardown
_ENGINES: weakref.WeakSet = weakref.WeakSet()


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a rendezvous of this machine's processes)."""
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
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ["LOCAL_RANK"] = "0"
    if local_rank >= 0:
        os.environ["LOCAL_RANK"] = str(local_rank)
    # before any group exists: this module's collectives take ``group=group.WORLD`` as a default
    # argument, evaluated on import; imported later (DeepSpeed does, lazily) its ten functions
    # would hold the default group past ``destroy_process_group`` (see shutdown_distributed)
    importlib.import_module("torch.distributed.nn")
    acc = deepspeed.get_accelerator()
    if acc.device_name() == "cuda":
        acc.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if acc.device_name() == "cpu":
        with _no_shm_op():
            deepspeed.init_distributed(timeout=datetime.timedelta(seconds=timeout_s))
    else:
        deepspeed.init_distributed(timeout=datetime.timedelta(seconds=timeout_s))


@contextlib.contextmanager
def _no_shm_op():
    """DeepSpeed's CPU backend without its shared-memory all-reduce op. DeepSpeed uses the op in
    ``inference_all_reduce`` alone (tensor-parallel inference); training's collectives go to
    ``torch.distributed`` whether it is loaded or not. Loading it costs every CPU run a probe of
    every op's compiler support and a wait on a file lock shared by every process of the machine,
    and the first run on a machine a JIT build of 2 to 3 minutes."""
    # the module, not the ``torch`` attribute that ``deepspeed.comm`` also has
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    build = ds_torch.build_shm_op
    ds_torch.build_shm_op = lambda: None
    try:
        yield
    finally:
        ds_torch.build_shm_op = build


def track_engine(engine) -> None:
    """Register a DeepSpeed engine for :func:`shutdown_distributed` to release."""
    _ENGINES.add(engine)


def _destroy_engines() -> None:
    # a function of its own: no frame of the teardown keeps the last engine while it collects
    for engine in list(_ENGINES):
        try:
            engine.destroy()
        except Exception as e:  # noqa: BLE001 - the run's work is done and saved: say so, go on
            log.warning("releasing a DeepSpeed engine failed: %r", e)


def shutdown_distributed(wait: bool = True) -> None:
    """Tear the process group down (after every rank has finished, with ``wait``; an error path
    leaves without waiting: the other ranks may be anywhere) and release what keeps its groups
    alive, so that their threads end here and not at interpreter exit.

    ``destroy_process_group`` only unregisters a group; gloo's worker threads end when the last
    reference to it goes. References that outlive a run: DeepSpeed's own (its clone of the world
    group, released by DeepSpeed's ``destroy_process_group``), its engines (ZeRO's gradient hooks
    make cycles the collector cannot see through: ``engine.destroy()`` removes them; each engine
    holds its data-parallel group), ZeRO-3's stack of modules in forward (DeepSpeed leaves the
    last one there) and ``torch.distributed.nn``'s default arguments (imported before the group
    exists by :func:`init_distributed`). A group left alive at exit aborts the rank now and then,
    after its work is done and saved: a gloo thread releasing a collective's tensors needs the GIL
    while the interpreter finalizes, CPython ends it with ``pthread_exit``, and the unwinding
    through the work's ``noexcept`` destructor calls ``std::terminate`` ("terminate called
    without an active exception", SIGABRT), and the launcher reports a finished run as failed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait:
            torch.distributed.barrier()
        _destroy_engines()  # DeepSpeed's destroy() asks for the rank: not after vLLM ended the group
        ds_comm = sys.modules.get("deepspeed.comm")
        if ds_comm is not None and ds_comm.is_initialized():
            ds_comm.destroy_process_group()
        else:
            torch.distributed.destroy_process_group()
    _ENGINES.clear()
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    if offload is not None:
        getattr(offload, "FWD_MODULE_STACK", []).clear()
    # until nothing more is found: finalizers run by one pass (the engines') free more cycles
    for _ in range(8):
        if not gc.collect():
            break


def process_group_threads() -> list[str]:
    """The names of this process's threads that serve a process group (gloo's), sorted; empty
    where ``/proc`` does not list threads. None remain once :func:`shutdown_distributed` has
    released every group."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return []
    names = []
    for tid in os.listdir(tasks):
        try:
            with open(os.path.join(tasks, tid, "comm")) as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(n for n in names if "gloo" in n)


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
