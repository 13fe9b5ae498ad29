"""Chapter 10: who is who in a multi-node job, and which device each process must use.

    torchrun --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB \\
        c10_multi_node_ranks.py

Run the same command on every node. Rank 0 prints one table for the whole job. With
--wait-for-world-size N, a smaller group waits for more nodes to join an elastic job
(--nnodes=MIN:MAX): torchrun then stops it and starts a bigger one.
"""

import argparse
import os
import sys
import time

import torch.distributed as dist

from dist_setup import setup, teardown


def parse_args():
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
    # The table needs the node's number, which only torchrun hands out.
    if "GROUP_RANK" not in os.environ:
        parser.error("start me with torchrun (see the example in --help)")
    return args


def my_row(rank, world_size):
    """Who this process is, and the GPU it would take by LOCAL_RANK and by RANK (M6)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    return {
        "RANK": rank,
        "GROUP_RANK (node)": int(os.environ["GROUP_RANK"]),
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world_size,
        "device from LOCAL_RANK": f"cuda:{local_rank}",
        "device from RANK (M6)": f"cuda:{rank}" + ("" if rank < local_world_size else " (no such GPU)"),
    }


def main():
    args = parse_args()
    setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # The restarts this node's agent counted.
    restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if world_size < args.wait_for_world_size:
        if rank == 0:
            sys.stdout.write(
                f"WORLD_SIZE={world_size}, TORCHELASTIC_RESTART_COUNT={restarts}: waiting for more nodes\n"
            )
            sys.stdout.flush()
        # torchrun stops this group when a node joins.
        time.sleep(args.wait_seconds)
        return f"c10_multi_node_ranks.py: error: no node joined within {args.wait_seconds:g} s"
    row = my_row(rank, world_size)
    rows, counts = [None] * world_size, [None] * world_size
    # One table, printed by rank 0.
    dist.all_gather_object(rows, row)
    dist.all_gather_object(counts, restarts)
    if rank == 0:
        local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
        lines = ["  ".join(f"{key:>22}" for key in row)]
        lines += ["  ".join(f"{str(r[key]):>22}" for key in row) for r in rows]
        gpus = "cuda:0" if local_world_size == 1 else f"cuda:0 to cuda:{local_world_size - 1}"
        backend = dist.get_backend()
        where = "this job's GPUs" if backend == "nccl" else f"for a GPU job; this one ran on the CPU ({backend})"
        lines += [
            f"(one process per GPU: on every node {gpus}, {where})",
            f"TORCHELASTIC_RESTART_COUNT on every process: {sorted(set(counts))}",
        ]
        sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
