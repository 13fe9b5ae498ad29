"""Train seed 003's model with DistributedDataParallel: chapter 04's reference script.

    python train_ddp.py --out work/run1                                     # one process
    torchrun --standalone --nproc_per_node=4 train_ddp.py --out work/run4   # four processes

The same --global-batch-size and --seed give the same final weights at every world size.
Writes data.pt, final.pt (the model's state_dict) and metrics.json to --out.
"""
import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SimpleModel(nn.Module):  # seed 003's model: one linear layer
    def __init__(self, input_dim=10, output_dim=1):
        super().__init__()
        self.linear = nn.Linear(input_dim, output_dim)

    def forward(self, x):
        return self.linear(x)


def make_data(samples, seed):
    """A regression the model can learn: y = X @ w_true + 0.5 + noise, fixed by the seed."""
    # (Seed 003 drew new random inputs at every access, for a constant target 1.0.)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(samples, 10, generator=g)
    w_true = torch.randn(10, 1, generator=g)
    y = X @ w_true + 0.5 + 0.1 * torch.randn(samples, 1, generator=g)
    return {"X": X, "y": y}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train seed 003's model with DDP.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch-size", type=int, default=64,  # NEW: split over the ranks
                        help="samples per step, all ranks together")  # NEW
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic data set")
    parser.add_argument("--seed", type=int, default=0, help="fixes the data, the shuffle and the init")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, required=True, help="folder for data.pt, final.pt, metrics.json")
    args = parser.parse_args(argv)  # NEW: check before starting anything
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # NEW
    if min(args.epochs, args.samples, args.global_batch_size) < 1:  # NEW: one line, exit code 2
        parser.error("--epochs, --samples and --global-batch-size must be at least 1")  # NEW
    if args.global_batch_size % world_size:  # NEW
        parser.error(f"--global-batch-size {args.global_batch_size} is not divisible "  # NEW
                     f"by the world size {world_size}")  # NEW
    if not args.lr > 0:  # NEW
        parser.error(f"--lr must be positive, got {args.lr}")  # NEW
    if args.out.exists() and not args.out.is_dir():  # NEW
        parser.error(f"--out {args.out} exists and is not a folder")  # NEW
    return args  # NEW


def setup():
    """Pick backend and device from what is present, and join the process group."""
    launched = "RANK" in os.environ  # NEW: torchrun (or mp.spawn) set RANK, LOCAL_RANK, ...
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # NEW: 0 without torchrun; not RANK
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # NEW: 1 without torchrun
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    if launched:  # NEW
        dist.init_process_group(backend, timeout=timedelta(seconds=30))  # NEW: indented
    else:  # NEW: plain `python train_ddp.py`: a group of one, in memory, no port needed
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,  # NEW
                                timeout=timedelta(seconds=30))  # NEW
    return backend, device


def main(argv=None):
    args = parse_args(argv)
    backend, device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch_size = args.global_batch_size // world_size  # NEW: per rank
    if rank == 0:  # rank 0 speaks for the job
        sys.stdout.write(f"backend={backend} device={device.type} world_size={world_size} "
                         f"global batch {args.global_batch_size}, per rank {batch_size}\n")  # NEW

    # Rank 0 "downloads" the data set; the others wait for it at the barrier.
    data_file = args.out / "data.pt"
    if rank == 0:  # one writer
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(make_data(args.samples, args.seed), data_file)
    dist.barrier()  # nobody reads before rank 0 has written
    data = torch.load(data_file, weights_only=True)
    dataset = TensorDataset(data["X"], data["y"])
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)  # same permutation on every rank
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)  # NEW: each rank its share

    torch.manual_seed(args.seed)  # the same initial weights on every run (DDP also broadcasts rank 0's)
    model = SimpleModel().to(device)  # move first, then wrap
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)

    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order every epoch
        running_loss = torch.zeros((), device=device)  # NEW: a tensor, to all-reduce it
        for X, y in loader:
            X, y = X.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.mse_loss(ddp_model(X), y)
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            running_loss += loss.detach()  # NEW: no .item(): no GPU sync every step
        epoch_loss = running_loss / len(loader)  # NEW: this rank's mean over its batches
        dist.all_reduce(epoch_loss)  # NEW: the sum over ranks (gloo has no AVG) ...
        losses.append(epoch_loss.item() / world_size)  # NEW: ... / world size = the global mean
        if rank == 0:
            sys.stdout.write(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}\n")  # NEW

    if rank == 0:  # one writer
        torch.save(ddp_model.module.state_dict(), args.out / "final.pt")  # the model inside DDP
        metrics = {"world_size": world_size, "global_batch_size": args.global_batch_size,  # NEW
                   "epochs": args.epochs, "loss": losses}  # NEW: the global mean loss per epoch
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")  # NEW
    dist.barrier()  # NEW: the checkpoint is complete before anyone reads it
    state = torch.load(args.out / "final.pt", map_location=device, weights_only=True)  # NEW
    replica = ddp_model.module.state_dict()  # NEW: each rank compares the file with its replica
    agree = torch.tensor([float(all(torch.equal(state[k], replica[k]) for k in state))], device=device)  # NEW
    dist.all_reduce(agree)  # NEW: rank 0 counts the ranks that agree
    if rank == 0:  # NEW
        sys.stdout.write(f"rank 0 wrote {args.out / 'final.pt'} and metrics.json; "  # NEW
                         f"{int(agree.item())} of {world_size} ranks reloaded it: equal to their replica\n")  # NEW
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
