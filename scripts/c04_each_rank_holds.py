"""What every rank holds: its ranks (M6), its random numbers (M11), its replica (M1, M3).

Launched as two emulated nodes with one process each (see notebook 04).
"""

import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
    backend, device = "nccl", torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
else:
    backend, device = "gloo", torch.device("cpu")
dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=device if backend == "nccl" else None)
rank, world_size = dist.get_rank(), dist.get_world_size()

# M6: the device index is LOCAL_RANK; RANK counts processes over all nodes.
# On node 1, RANK is 1 but LOCAL_RANK is 0: with one GPU per node, cuda:1 does not exist there.

# M11: the same seed gives every process the same numbers; seed + rank gives its own.
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
params = sum(p.numel() for p in ddp_model.parameters())  # M1: the whole model, on every rank

row = {
    "node (GROUP_RANK)": os.environ["GROUP_RANK"],
    "LOCAL_RANK": local_rank,
    "torch.rand(2), seed 0": " ".join(f"{x:.4f}" for x in same_seed),
    "torch.rand(2), seed 0 + rank": " ".join(f"{x:.4f}" for x in own_seed),
    "weight[0,0] before DDP(...)": f"{before:+.4f}",
    "weight[0,0] after DDP(...)": f"{after:+.4f}",
    "parameters in this replica": params,
}
rows = [None] * world_size
dist.all_gather_object(rows, row)  # one table, printed by rank 0 in rank order
if rank == 0:
    lines = [f"{'':30}" + "".join(f"{f'RANK={r}':>16}" for r in range(world_size))]
    lines += [f"{key:30}" + "".join(f"{str(rw[key]):>16}" for rw in rows) for key in row]
    sys.stdout.write("\n".join(lines) + "\n")
del ddp_model, model  # DDP holds the group: release it here, not at exit, where
gc.collect()  # gloo's threads torn down during interpreter shutdown can abort the process
dist.destroy_process_group()
