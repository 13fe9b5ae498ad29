"""c04_train_ddp.py launched with mp.spawn, not torchrun: python c04_mp_spawn.py --out work/spawn.

The arguments go to c04_train_ddp.py unchanged; this file only does the launcher's job."""

import os
import sys

import torch.multiprocessing as mp

# The script next to this one: its main() is the training.
import c04_train_ddp
from dist_setup import free_port, teardown

NPROCS = 2


def worker(local_rank, nprocs, argv):
    """mp.spawn passes the process index first; the rest are this function's args."""
    # The launcher's job, done by hand: the variables torchrun would have set.
    os.environ.update(
        RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs)
    )
    c04_train_ddp.main(argv)
    # As c04_train_ddp.py's own __main__ block does: leave the group while Python still runs.
    teardown()


if __name__ == "__main__":
    # One machine only; the port is free now, but another job may grab it before rank 0 does.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    # Raises if any worker fails.
    mp.spawn(worker, args=(NPROCS, sys.argv[1:]), nprocs=NPROCS)
