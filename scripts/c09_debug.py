"""Chapter 09: two bugs that hang a job, and the tools that turn them into readable errors.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node=2 c09_debug.py mismatch
    torchrun --standalone --nproc_per_node=2 c09_debug.py stuck

mismatch: rank 0 all-reduces 4 numbers, rank 1 five; rank 0 prints what each rank called.
stuck:    rank 1 is stuck in load_batch(); faulthandler writes where, and rank 0's
          monitored_barrier names the rank that did not arrive.
"""
import argparse
import faulthandler
import os
import re
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def load_batch(seconds):  # stands for a read from a dead file system, a deadlock, ...
    time.sleep(seconds)


def setup(timeout):
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return device


def mismatch(rank, device):
    x = torch.ones(4 if rank == 0 else 5, device=device)  # the bug: shapes differ between ranks
    try:
        dist.all_reduce(x)
        report = "all_reduce returned: no error detected"
    except RuntimeError as e:
        report = re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\)\)", "", str(e))  # shorter
        report = re.sub(r"(?<=\.)(Collectives differ)", r"\n\1", report).replace("   ", " ")
    if rank == 0:
        sys.stdout.write(f"rank 0: {report}\n")


def stuck(rank, out_dir):
    timeout = timedelta(seconds=1.5)
    try:
        if rank == 1:
            with open(os.path.join(out_dir, "c09_stack_rank1.txt"), "w") as f:
                faulthandler.dump_traceback_later(1.0, file=f)  # where is this rank after 1 s?
                load_batch(4)
                faulthandler.cancel_dump_traceback_later()
        dist.monitored_barrier(timeout=timeout)  # gloo only: rank 0 waits for each rank in turn
        report = "every rank arrived"
    except RuntimeError as e:
        report = str(e).splitlines()[0]
    if rank == 0:
        sys.stdout.write(f"rank 0: {report}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["mismatch", "stuck"])
    parser.add_argument("--out-dir", default="work", help="folder for the stack dump")
    args = parser.parse_args()
    device = setup(timeout=5)  # seconds: a hang becomes an error quickly
    rank = dist.get_rank()
    if args.mode == "mismatch":
        mismatch(rank, device)
    else:
        stuck(rank, args.out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
