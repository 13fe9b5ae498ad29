"""Point to point: send/recv, isend/irecv round a ring, and the deadlock of blocking sends."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

# The block taught above, in the file beside this one.
from c03_torchrun_environment import print_in_rank_order, setup, teardown


def main():
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        sys.exit("c03_send_recv.py: error: needs 2 or more processes: torchrun --nproc_per_node=2 c03_send_recv.py")
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    # 1. blocking send/recv, rank 0 -> rank 1
    if rank == 0:
        x = torch.tensor([1.0, 2.0, 3.0], device=device)
        dist.send(x, dst=1)
        text = f"rank 0 sent     {x.tolist()}"
    elif rank == 1:
        # The receiver allocates: same shape and dtype.
        x = torch.zeros(3, device=device)
        dist.recv(x, src=0)
        text = f"rank 1 received {x.tolist()}"
    else:
        text = f"rank {rank} took no part"
    print_in_rank_order("send/recv:   " + text)

    # 2. isend/irecv: every rank passes a tensor to its right neighbour, all at once
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    outgoing = torch.full((2,), float(rank), device=device)
    incoming = torch.empty(2, device=device)
    # Posted as one batch: the grouping rule (nccl), harmless on gloo.
    ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, incoming, left)]
    requests = dist.batch_isend_irecv(ops)
    # The buffer rule: until wait() returns, do not change `outgoing`, do not read `incoming`.
    for request in requests:
        request.wait()
    print_in_rank_order(f"isend/irecv: rank {rank} received {incoming.tolist()} from rank {left}")

    # 3. the same ring with blocking calls, every rank sending first
    if dist.get_backend() == "gloo":
        # A group that gives up after 2 s, not 30.
        quick = dist.new_group(timeout=timedelta(seconds=2))
        try:
            dist.send(outgoing, dst=right, group=quick)
            dist.recv(incoming, src=left, group=quick)
            text = "finished"
        except RuntimeError:
            # "Timed out ...", or "Connection closed" if the peer gave up first.
            text = "never got out of send: deadlock, ended by the timeout"
    else:
        # A hung NCCL operation ends the process instead: do not try it.
        text = "skipped on nccl"
    print_in_rank_order(f"all send first: rank {rank} {text}")


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
