"""train_ddp.py launched with mp.spawn, not torchrun: python c04_mp_spawn.py --out work/spawn.

The arguments go to train_ddp.py unchanged; this file only does the launcher's job."""

import gc
import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

import train_ddp  # the script next to this one: its main() is the training

NPROCS = 2


def free_port():
    """A port that was free a moment ago: the OS picks it when we bind to port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(local_rank, nprocs, argv):  # mp.spawn passes the process index first
    # The launcher's job, done by hand: the variables torchrun would have set.
    os.environ.update(
        RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs)
    )
    train_ddp.main(argv)
    gc.collect()  # as train_ddp.py's own __main__ block does: free what main() left on the group,
    dist.destroy_process_group()  # then leave it, while Python still runs


if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # one machine only
    os.environ["MASTER_PORT"] = str(free_port())  # free now; another job may grab it before rank 0 does
    mp.spawn(worker, args=(NPROCS, sys.argv[1:]), nprocs=NPROCS)  # raises if any worker fails
