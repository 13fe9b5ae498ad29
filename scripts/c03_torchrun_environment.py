"""Who am I? The environment torchrun gives each process, and what seeding does per rank."""

import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def setup():
    """Join the process group (init method env://); return the device to use."""
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    # env:// reads MASTER_ADDR/PORT etc.; on nccl, device_id binds the group to this GPU
    dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=device if backend == "nccl" else None)
    return backend, device


def print_in_rank_order(text):
    """Gather one text per rank to rank 0, which prints them in rank order."""
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, text)
    if dist.get_rank() == 0:
        sys.stdout.write("\n".join(texts) + "\n")


def main():
    backend, device = setup()
    rank = dist.get_rank()
    env = {k: os.environ[k] for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"]}
    if rank == 0:
        sys.stdout.write(
            f"backend={backend} device={device.type}\n"
            f"MASTER_ADDR:MASTER_PORT = {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}\n"
        )
    print_in_rank_order(" ".join(f"{k}={v}" for k, v in env.items()))

    torch.manual_seed(0)  # the same seed on every rank ...
    same = torch.rand(3)
    torch.manual_seed(0 + rank)  # ... or a seed per rank
    per_rank = torch.rand(3)
    print_in_rank_order(
        f"rank {rank}: manual_seed(0) -> {[round(v, 4) for v in same.tolist()]}   "
        f"manual_seed(0 + rank) -> {[round(v, 4) for v in per_rank.tolist()]}"
    )


if __name__ == "__main__":
    main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
