"""Chapter 09: bugs that hang or break a job, and the tools that make them readable.

    torchrun --standalone --nproc_per_node=2 c09_failures.py stuck
    torchrun --standalone --nproc_per_node=2 c09_failures.py mismatch
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node=2 c09_failures.py mismatch
    torchrun --standalone --nproc_per_node=2 --max-restarts=1 c09_failures.py stale-store

stuck:       rank 1 is stuck in load_batch(); faulthandler writes where, and rank 0's
             monitored_barrier (on a gloo group, whatever the backend) names the rank that did not arrive.
mismatch:    rank 0 all-reduces 4 numbers, rank 1 five; with TORCH_DISTRIBUTED_DEBUG=DETAIL rank 0
             prints what each rank called.
stale-store: attempt 0 joins a process group and crashes; attempt 1 finds attempt 0's keys in the
             store torchrun keeps across restarts.
"""

import argparse
import faulthandler
import gc
import os
import re
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=5)  # a hang becomes an error quickly


def load_batch(seconds):  # stands for a read from a dead file system, a deadlock, ...
    time.sleep(seconds)


def pick_backend():
    """nccl with one GPU per process if there are enough GPUs, else gloo on the CPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def mismatch(rank, device):
    x = torch.ones(4 if rank == 0 else 5, device=device)  # the bug: shapes differ between ranks
    try:
        dist.all_reduce(x)
        values = x.tolist()  # waits for the result (nccl runs collectives asynchronously)
        report = f"all_reduce returned without an error: rank 0 holds {values}"
    except RuntimeError as e:
        report = re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\)\)", "", str(e))  # shorter
        report = re.sub(r"(?<=\.)(Collectives differ)", r"\n\1", report).replace("   ", " ")
    if rank == 0:
        sys.stdout.write(f"rank 0: {report}\n")


def stuck(rank, backend, out_dir):
    # monitored_barrier exists for gloo only (a ValueError on nccl): beside nccl, a gloo group
    group = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=TIMEOUT)
    try:
        if rank == 1:
            with open(os.path.join(out_dir, "c09_stack_rank1.txt"), "w") as f:
                faulthandler.dump_traceback_later(1.0, file=f)  # where is this rank after 1 s?
                load_batch(4)
                faulthandler.cancel_dump_traceback_later()
        dist.monitored_barrier(group, timeout=timedelta(seconds=1.5))  # rank 0 waits for each rank in turn
        report = "every rank arrived"
    except RuntimeError as e:  # on rank 1 too, once rank 0 has given up and left
        report = str(e).splitlines()[0]
    if rank == 0:
        sys.stdout.write(f"rank 0: {report}\n")


def stale_store(rank, backend, device):
    """Attempt 0 joins the plain way and crashes; attempt 1 looks into torchrun's store first."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        sys.exit("c09_failures.py: error: stale-store needs torchrun (--standalone or c10d) with --max-restarts=1")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=TIMEOUT
    )  # the store torchrun's agent hosts
    if attempt == 0:
        # its keys go straight into that store
        dist.init_process_group(backend, timeout=TIMEOUT, device_id=device if backend == "nccl" else None)
        dist.barrier()  # every rank has joined
        if rank == 1:
            raise RuntimeError("attempt 0: rank 1 crashes")
        dist.barrier()  # rank 0 waits here until torchrun stops it
    elif rank == 0:
        left = sorted(k for k in store.list_keys() if k.startswith("default_pg/"))
        sys.stdout.write(f"attempt {attempt}, before joining any group, finds in torchrun's store: {left}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["mismatch", "stuck", "stale-store"])
    parser.add_argument("--out-dir", default="work", help="folder for the stack dump")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        parser.error("start me with torchrun (see the examples in --help)")
    backend, device = pick_backend()
    rank = int(os.environ["RANK"])
    if args.mode == "stale-store":
        stale_store(rank, backend, device)
        return
    dist.init_process_group(backend, timeout=TIMEOUT, device_id=device if backend == "nccl" else None)
    if args.mode == "mismatch":
        mismatch(rank, device)
    else:
        stuck(rank, backend, args.out_dir)


if __name__ == "__main__":
    main()
    if dist.is_initialized():  # stale-store's second attempt never joins a group
        gc.collect()  # main() has returned: free what it built on the group,
        dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
