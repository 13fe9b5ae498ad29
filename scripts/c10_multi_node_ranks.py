"""Chapter 10: who is who in a multi-node job, and which device each process must use.

    torchrun --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB \\
        c10_multi_node_ranks.py

Run the same command on every node. Rank 0 prints one table for the whole job. With
--wait-for-world-size N, a smaller group waits for more nodes to join an elastic job
(--nnodes=MIN:MAX): torchrun then stops it and starts a bigger one.
"""

import argparse
import gc
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wait-for-world-size",
        type=int,
        default=0,
        metavar="N",
        help="while the job has fewer than N processes, wait for nodes to join",
    )
    parser.add_argument("--wait-seconds", type=float, default=45, help="how long to wait for them")
    args = parser.parse_args()
    if "GROUP_RANK" not in os.environ:
        parser.error("start me with torchrun (see the example in --help)")
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    # nccl: bind the group to this process's GPU (its communicator is made now, barrier() uses it)
    dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=device if backend == "nccl" else None)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])  # restarts this node's agent counted
    if world_size < args.wait_for_world_size:
        if rank == 0:
            sys.stdout.write(
                f"WORLD_SIZE={world_size}, TORCHELASTIC_RESTART_COUNT={restarts}: waiting for more nodes\n"
            )
            sys.stdout.flush()
        time.sleep(args.wait_seconds)  # torchrun stops this group when a node joins
        sys.exit(f"c10_multi_node_ranks.py: error: no node joined within {args.wait_seconds:g} s")
    row = {
        "RANK": rank,
        "GROUP_RANK (node)": int(os.environ["GROUP_RANK"]),
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world_size,
        "device from LOCAL_RANK": f"cuda:{local_rank}",
        "device from RANK (M6)": f"cuda:{rank}" + ("" if rank < local_world_size else " (no such GPU)"),
    }
    rows, counts = [None] * world_size, [None] * world_size
    dist.all_gather_object(rows, row)  # one table, printed by rank 0
    dist.all_gather_object(counts, restarts)
    if rank == 0:
        lines = ["  ".join(f"{key:>22}" for key in row)]
        lines += ["  ".join(f"{str(r[key]):>22}" for key in row) for r in rows]
        gpus = "cuda:0" if local_world_size == 1 else f"cuda:0 to cuda:{local_world_size - 1}"
        where = "this job's GPUs" if backend == "nccl" else f"for a GPU job; this one ran on the CPU ({backend})"
        lines += [
            f"(one process per GPU: on every node {gpus}, {where})",
            f"TORCHELASTIC_RESTART_COUNT on every process: {sorted(set(counts))}",
        ]
        sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
