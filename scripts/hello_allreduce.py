import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    # This process's index on this machine.
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    # nccl needs one GPU per process; otherwise use gloo on the CPU.
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    # A short timeout turns a hung collective into an error instead of the default wait (30 minutes;
    # 10 on nccl, whose watchdog then ends the process). On nccl, device_id binds the group to this
    # process's GPU: nccl sets up its communicator right here.
    dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=device if backend == "nccl" else None)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    x = torch.tensor([rank + 1.0], device=device)
    # Default op: SUM, result on every rank.
    dist.all_reduce(x)
    expected = world_size * (world_size + 1) / 2

    # Gather one line per rank to rank 0 and print them in rank order: deterministic output.
    line = f"rank {rank} of {world_size}: all_reduce gave {x.item():g} (expected {expected:g})"
    lines = [None] * world_size
    dist.all_gather_object(lines, line)
    if rank == 0:
        sys.stdout.write(f"backend={backend} device={device.type}\n" + "\n".join(lines) + "\n")
        ok = all(f"gave {expected:g} " in line for line in lines)
        sys.stdout.write("OK: every rank holds the sum\n" if ok else "MISMATCH\n")


if __name__ == "__main__":
    main()
    # main() has returned: free what it left on the group (its tensors), then leave the group
    # while Python still runs: a gloo group alive at exit can abort the process.
    gc.collect()
    dist.destroy_process_group()
