"""train_single.py made distributed: python c04_train_ddp.py --out work/run1 (one process) or
torchrun --standalone --nproc_per_node=4 c04_train_ddp.py --out work/run4 (four processes).

The same --global-batch-size and --seed give the same final weights at every world size (up to
rounding). The model, the data and the epoch come from train_single.py unchanged; chapter 09
grows this script into train_ddp.py, which resumes after crashes.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_setup import setup, teardown
from train_single import SimpleModel, make_data, train_epoch


def add_arguments(parser):
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch-size", type=int, default=64, help="samples per step, all ranks together")
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic data set")
    parser.add_argument("--seed", type=int, default=0, help="fixes the data, the shuffle and the init")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, required=True, help="folder for data.pt, final.pt, metrics.json")


def check_arguments(parser, args):
    """Refuse bad arguments in one line and exit code 2, before any process group is made."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if min(args.epochs, args.samples, args.global_batch_size) < 1:
        parser.error("--epochs, --samples and --global-batch-size must be at least 1")
    if args.global_batch_size % world_size:
        parser.error(f"--global-batch-size {args.global_batch_size} is not divisible by the world size {world_size}")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a linear regression with DDP.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def make_loader(args):
    """Rank 0 writes the data set; then every rank reads it, and takes its share."""
    data_file = args.out / "data.pt"
    # One writer: every rank writing the same file at once can leave it garbled.
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(make_data(args.samples, args.seed), data_file)
    # Nobody reads before rank 0 has written.
    dist.barrier()
    data = torch.load(data_file, weights_only=True)
    dataset = TensorDataset(data["X"], data["y"])
    # The same permutation on every rank (the same seed); each rank reads every world_size-th item.
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    batch_size = args.global_batch_size // dist.get_world_size()
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def make_model(args, device):
    # The same initial weights on every run (and DDP broadcasts rank 0's to the others).
    torch.manual_seed(args.seed)
    # Move first, then wrap; device_ids only for a GPU module (M7).
    model = SimpleModel().to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    return ddp_model, optimizer


def save_results(args, ddp_model, metrics, device):
    """Rank 0 writes final.pt and metrics.json; every rank then reloads final.pt as a resumed job
    would, and compares it with its replica. Returns how many ranks found them equal."""
    if dist.get_rank() == 0:
        # The model inside DDP: its keys have no "module." prefix and load into a plain model.
        torch.save(ddp_model.module.state_dict(), args.out / "final.pt")
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    # The file is complete before anyone reads it.
    dist.barrier()
    # Onto this rank's device; weights_only: no pickled code runs.
    state = torch.load(args.out / "final.pt", map_location=device, weights_only=True)
    replica = ddp_model.module.state_dict()
    agree = torch.tensor([float(all(torch.equal(state[k], replica[k]) for k in state))], device=device)
    dist.all_reduce(agree)
    return int(agree.item())


def main(argv=None):
    args = parse_args(argv)
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = make_loader(args)
    # Rank 0 speaks for the job.
    if rank == 0:
        sys.stdout.write(
            f"backend={dist.get_backend()} device={device.type} world_size={world_size} "
            f"global batch {args.global_batch_size}, per rank {loader.batch_size}\n"
        )
    ddp_model, optimizer = make_model(args, device)
    losses = []
    for epoch in range(args.epochs):
        # A new order every epoch (M5).
        loader.sampler.set_epoch(epoch)
        # This rank's mean loss over its batches; DDP averaged the gradients in backward().
        loss = train_epoch(ddp_model, loader, optimizer, device)
        # The job's loss is the mean over ranks (M9): every rank ran as many batches of one size.
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
        if rank == 0:
            sys.stdout.write(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}\n")
    metrics = {"world_size": world_size, "global_batch_size": args.global_batch_size, "epochs": args.epochs}
    agree = save_results(args, ddp_model, {**metrics, "loss": losses}, device)
    if rank == 0:
        sys.stdout.write(
            f"rank 0 wrote {args.out / 'final.pt'} and metrics.json; "
            f"{agree} of {world_size} ranks reloaded it: equal to their replica\n"
        )
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
