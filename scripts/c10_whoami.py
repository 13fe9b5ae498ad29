"""Chapter 10: who is who in a multi-node job, and which device each process must use.

    torchrun --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB c10_whoami.py

Run the same command on every node. Rank 0 prints one table for the whole job.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend = "nccl"
        torch.cuda.set_device(local_rank)
    else:
        backend = "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=30))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    row = {
        "RANK": rank,
        "GROUP_RANK (node)": int(os.environ["GROUP_RANK"]),
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world_size,
        "device from LOCAL_RANK": f"cuda:{local_rank}",
        "device from RANK (M6)": f"cuda:{rank}" + ("" if rank < local_world_size else " (no such GPU)"),
    }
    rows = [None] * world_size
    dist.all_gather_object(rows, row)  # one table, printed by rank 0
    if rank == 0:
        lines = ["  ".join(f"{key:>22}" for key in row)]
        lines += ["  ".join(f"{str(r[key]):>22}" for key in row) for r in rows]
        sys.stdout.write("\n".join(lines) + f"\n(each node has {local_world_size} processes, "
                         f"so {local_world_size} GPUs: cuda:0 to cuda:{local_world_size - 1})\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
