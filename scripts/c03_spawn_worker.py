"""A worker that mp.spawn can start: it lives in a file that the children import."""

import gc
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    """A port that is free right now on this machine (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world_size, init_method, results):
    """Join the group, all-reduce rank + 1, write the result into a shared tensor."""
    # mp.spawn sets no environment variables: rank and world size are passed explicitly.
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        backend, device = "nccl", torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=30),
        device_id=device if backend == "nccl" else None,
    )
    x = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(x)
    results[rank] = x.item()
    # As in every script here: free what is unused, then leave the group.
    gc.collect()
    dist.destroy_process_group()


# `python c03_spawn_worker.py` also works.
if __name__ == "__main__":
    world_size = 2
    results = torch.zeros(world_size).share_memory_()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(worker, args=(world_size, init_method, results), nprocs=world_size)
    sys.stdout.write(f"all_reduce of rank + 1 on each rank: {results.tolist()}\n")
