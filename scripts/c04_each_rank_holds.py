"""What every rank holds: its ranks (M6), its random numbers (M11), its replica (M1, M3), its
loss (M9). Launched as two emulated nodes with one process each (see notebook 04).
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_setup import setup, teardown


def what_this_rank_holds(device):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # M11: the same seed gives every process the same numbers; seed + rank gives each its own.
    torch.manual_seed(0)
    same_seed = torch.rand(2).tolist()
    torch.manual_seed(0 + rank)
    own_seed = torch.rand(2).tolist()

    # M3: different seeds give different initial weights ... until DDP broadcasts rank 0's.
    torch.manual_seed(100 + rank)
    model = nn.Linear(10, 1).to(device)
    before = model.weight[0, 0].item()
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    after = model.weight[0, 0].item()

    # M9: each rank's loss is the loss of its share of the batch; the job's is their mean.
    X = torch.randn(8, 10, generator=torch.Generator().manual_seed(0))
    y = X.sum(dim=1, keepdim=True)
    loss = F.mse_loss(ddp_model(X[rank::world_size].to(device)), y[rank::world_size].to(device))
    job_loss = loss.detach().clone()
    dist.all_reduce(job_loss, op=dist.ReduceOp.AVG)

    # M6: the device index is LOCAL_RANK; RANK counts processes over all nodes. On node 1, RANK
    # is 1 but LOCAL_RANK is 0: with one GPU per node, cuda:1 does not exist there.
    return {
        "node (GROUP_RANK)": os.environ["GROUP_RANK"],
        "LOCAL_RANK": os.environ["LOCAL_RANK"],
        "torch.rand(2), seed 0": " ".join(f"{x:.4f}" for x in same_seed),
        "torch.rand(2), seed 0 + rank": " ".join(f"{x:.4f}" for x in own_seed),
        "weight[0,0] before DDP(...)": f"{before:+.4f}",
        "weight[0,0] after DDP(...)": f"{after:+.4f}",
        # M1: the whole model, on every rank.
        "parameters in this replica": sum(p.numel() for p in ddp_model.parameters()),
        "loss of its half of a batch": f"{loss.item():.4f}",
        "loss all-reduced (mean)": f"{job_loss.item():.4f}",
    }


def main():
    device = setup()
    row = what_this_rank_holds(device)
    rows = [None] * dist.get_world_size()
    # One table, printed by rank 0 in rank order.
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        lines = [f"{'':30}" + "".join(f"{f'RANK={r}':>16}" for r in range(len(rows)))]
        lines += [f"{key:30}" + "".join(f"{str(rw[key]):>16}" for rw in rows) for key in row]
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
