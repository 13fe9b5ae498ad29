"""Inside DDP, part 3: uneven inputs (with and without Join), and evaluation under padding.

torchrun --standalone --nproc_per_node=2 c05_uneven_inputs.py
"""

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# The helpers of part 1, in the file beside this one.
from c05_ddp_internals import gathered, print0
from dist_setup import setup, teardown


def print_in_rank_order(text):
    """One line per rank, printed by rank 0 in rank order."""
    lines = [None] * dist.get_world_size()
    dist.all_gather_object(lines, text)
    print0("\n".join(lines))


def train(ddp_model, batches, device, done):
    """Train on the batches; done[0] counts the batches finished."""
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    for x, y in batches:
        F.mse_loss(ddp_model(x.to(device)), y.to(device)).backward()
        optimizer.step()
        optimizer.zero_grad()
        done[0] += 1


def uneven(backend, device, rank):
    torch.manual_seed(1)
    # E.g. a dataset split by files of different sizes.
    n_batches = 5 if rank == 0 else 3
    batches = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(n_batches)]
    if backend == "gloo":
        # A group of its own with a short timeout, so the wait becomes an error quickly.
        impatient = dist.new_group(timeout=timedelta(seconds=3))
        ddp_model = DDP(nn.Linear(8, 1).to(device), process_group=impatient)
        done = [0]
        try:
            train(ddp_model, batches, device, done)
            result = f"finished its {done[0]} batches"
        except RuntimeError as e:
            timed_out = "timed out" in str(e).lower()
            result = (
                f"RuntimeError after {done[0]} batches "
                f"({'timed out ' if timed_out else ''}waiting for an all-reduce partner)"
            )
        print_in_rank_order(f"  without Join, rank {rank} ({n_batches} batches): {result}")
    else:
        print0("  without Join: skipped on nccl (a timed-out NCCL collective aborts the process)")

    torch.manual_seed(0)
    ddp_model = DDP(nn.Linear(8, 1).to(device))
    done = [0]
    # NEW: a rank that runs out of data shadows the others' all-reduces.
    with Join([ddp_model]):
        train(ddp_model, batches, device, done)
    print_in_rank_order(f"  with Join, rank {rank}: trained on {done[0]} batches")
    weights = gathered(ddp_model.module.weight.detach())
    print0(f"  with Join: weights identical on all ranks after: {all(torch.equal(w, weights[0]) for w in weights)}")


def evaluation(device, rank, world_size):
    g = torch.Generator().manual_seed(3)
    # Not a multiple of the world size: the sampler pads.
    n = 9
    X, y = torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to(device).eval()
    with torch.no_grad():
        single = (model(X.to(device)).argmax(1) == y.to(device)).sum().item()
    print0(f"  one process, all {n} samples: accuracy {single}/{n} = {single / n:.4f}")

    # Pads to a multiple of world_size.
    sampler = DistributedSampler(TensorDataset(X, y), shuffle=False)
    indices = list(sampler)
    print_in_rank_order(f"  rank {rank} evaluates samples {indices}")
    loader = DataLoader(TensorDataset(X, y), batch_size=4, sampler=sampler)
    correct = count = 0
    correct_real = count_real = 0
    # Position in this rank's share: the global position is position * world_size + rank.
    position = 0
    with torch.no_grad():
        for xb, yb in loader:
            right = (model(xb.to(device)).argmax(1) == yb.to(device)).tolist()
            for r in right:
                # False for the padded duplicates.
                real = position * world_size + rank < n
                correct, count = correct + r, count + 1
                correct_real, count_real = correct_real + (r and real), count_real + real
                position += 1
    accuracies = [None] * world_size
    dist.all_gather_object(accuracies, correct / count)
    print0(f"  wrong: rank 0's accuracy alone: {accuracies[0]:.4f}")
    print0(f"  wrong: mean of the ranks' accuracies: {sum(accuracies) / world_size:.4f}")
    for verdict, n_right, n_total in [
        ("wrong: all-reduced sums with the padding", correct, count),
        ("right: all-reduced sums without the padding", correct_real, count_real),
    ]:
        totals = torch.tensor([n_right, n_total], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        print0(f"  {verdict}: {int(totals[0])}/{int(totals[1])} = {(totals[0] / totals[1]).item():.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print0("1. Uneven inputs: rank 0 has 5 batches, rank 1 has 3:")
    uneven(dist.get_backend(), device, rank)
    print0("2. Evaluation under sampler padding:")
    evaluation(device, rank, world_size)


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
