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
import os
import re
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from dist_setup import setup, teardown

# Seconds: a hang becomes an error quickly.
TIMEOUT_S = 5


def load_batch(seconds):
    """Stands for a read from a dead file system, a deadlock, ..."""
    time.sleep(seconds)


def stuck(out_dir):
    rank = dist.get_rank()
    # monitored_barrier exists for gloo only (a ValueError on nccl): beside nccl, a gloo group.
    gloo = dist.get_backend() == "gloo"
    group = None if gloo else dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
    try:
        if rank == 1:
            with open(os.path.join(out_dir, "c09_stack_rank1.txt"), "w") as f:
                # Where is this rank after 1 s? Its Python stack, written to f.
                faulthandler.dump_traceback_later(1.0, file=f)
                load_batch(4)
                faulthandler.cancel_dump_traceback_later()
        # Rank 0 waits for each rank in turn, and names the first that does not arrive.
        dist.monitored_barrier(group, timeout=timedelta(seconds=1.5))
        report = "every rank arrived"
    except RuntimeError as e:
        # On rank 1 too, once rank 0 has given up and left.
        report = str(e).splitlines()[0]
    if rank == 0:
        sys.stdout.write(f"rank 0: {report}\n")


def mismatch(device):
    rank = dist.get_rank()
    # The bug: the shapes differ between ranks.
    x = torch.ones(4 if rank == 0 else 5, device=device)
    try:
        dist.all_reduce(x)
        # Waits for the result (nccl runs collectives asynchronously).
        values = x.tolist()
        report = f"all_reduce returned without an error: rank 0 holds {values}"
    except RuntimeError as e:
        # Shorter: without the tensor options, one aspect per line.
        report = re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\)\)", "", str(e))
        report = re.sub(r"(?<=\.)(Collectives differ)", r"\n\1", report).replace("   ", " ")
    if rank == 0:
        sys.stdout.write(f"rank 0: {report}\n")


def stale_store():
    """Attempt 0 joins a group (dist_setup's way) and crashes; attempt 1 looks into torchrun's
    store before it joins anything."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        sys.exit("c09_failures.py: error: stale-store needs torchrun (--standalone or c10d) with --max-restarts=1")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0:
        setup(timeout_s=TIMEOUT_S)
        # Every rank has joined: its keys are in the store.
        dist.barrier()
        if dist.get_rank() == 1:
            raise RuntimeError("attempt 0: rank 1 crashes")
        # Rank 0 waits here until torchrun stops it.
        dist.barrier()
    elif os.environ["RANK"] == "0":
        # The store torchrun's agent hosts, and keeps across restarts.
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=5)
        )
        # dist_setup.setup() wrote attempt 0's keys under the prefix attempt_0/.
        left = sorted(key for key in store.list_keys() if key.startswith(f"attempt_{attempt - 1}/"))
        sys.stdout.write(f"attempt {attempt}, before joining any group, finds in torchrun's store: {left}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["mismatch", "stuck", "stale-store"])
    parser.add_argument("--out-dir", default="work", help="folder for the stack dump")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        parser.error("start me with torchrun (see the examples in --help)")
    if args.mode == "stale-store":
        stale_store()
        return 0
    device = setup(timeout_s=TIMEOUT_S)
    if args.mode == "mismatch":
        mismatch(device)
    else:
        stuck(args.out_dir)
    return 0


if __name__ == "__main__":
    code = main()
    # stale-store's second attempt never joins a group: teardown() then does nothing.
    teardown()
    sys.exit(code)
