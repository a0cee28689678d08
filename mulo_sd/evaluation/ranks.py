"""Processes of a multi-process generation run, through torch.distributed directly (no Lightning here).

`torchrun --nproc_per_node=N ...` sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address; `init_ranks`
joins that group (gloo on CPU, nccl on CUDA, each rank on its own GPU) and returns (rank, world size,
device). Without WORLD_SIZE > 1 it is a single process: (0, 1, device).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_ranks(device: str | torch.device) -> tuple[int, int, torch.device]:
    device = torch.device(device)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1, device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast(value):
    """Rank 0's `value` on every rank (a picklable object); `value` itself in a single process."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def close_ranks() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
