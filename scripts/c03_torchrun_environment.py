"""Who am I? The environment torchrun gives each process, and what seeding does per rank.

The chapter's other scripts import setup() and teardown() from this file, beside them.
"""

import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def pick_device():
    """cuda:LOCAL_RANK when every process on this machine gets a GPU of its own, else the CPU."""
    # LOCAL_RANK, not RANK: on a second machine RANK goes on counting, past its last GPU.
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def setup(timeout_s=30):
    """Join the group torchrun describes (init method env://); return this process's device."""
    # The backend follows the device: nccl on a GPU, gloo on the CPU (dist.get_backend() says
    # which). A collective that waits longer than timeout_s raises instead of hanging.
    device = pick_device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. On nccl, device_id binds the
    # group to this process's GPU: nccl sets up its communicator right here.
    device_id = device if backend == "nccl" else None
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), device_id=device_id)
    return device


def teardown():
    """Leave the group, once main() has returned."""
    # Collect first: what main() built on the group (its tensors; later, DDP models) keeps it
    # alive, and a gloo group still alive while Python shuts down can abort a finished process.
    gc.collect()
    dist.destroy_process_group()


def print_in_rank_order(text):
    """Gather one text per rank to rank 0, which prints them in rank order."""
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, text)
    if dist.get_rank() == 0:
        sys.stdout.write("\n".join(texts) + "\n")


def main():
    device = setup()
    rank = dist.get_rank()
    env = {k: os.environ[k] for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"]}
    if rank == 0:
        sys.stdout.write(
            f"backend={dist.get_backend()} device={device.type}\n"
            f"MASTER_ADDR:MASTER_PORT = {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}\n"
        )
    print_in_rank_order(" ".join(f"{k}={v}" for k, v in env.items()))

    # The same seed on every rank ...
    torch.manual_seed(0)
    same = torch.rand(3)
    # ... or a seed per rank.
    torch.manual_seed(0 + rank)
    per_rank = torch.rand(3)
    print_in_rank_order(
        f"rank {rank}: manual_seed(0) -> {[round(v, 4) for v in same.tolist()]}   "
        f"manual_seed(0 + rank) -> {[round(v, 4) for v in per_rank.tolist()]}"
    )


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
