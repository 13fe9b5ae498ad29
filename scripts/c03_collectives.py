"""The six collectives, each printed before -> after in rank order from rank 0."""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# The block taught above, in the file beside this one.
from c03_torchrun_environment import setup, teardown


def show_ranks(title, text):
    """Gather one line per rank; rank 0 prints the title and the lines in rank order."""
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, f"  rank {dist.get_rank()}: {text}")
    if dist.get_rank() == 0:
        sys.stdout.write(title + "\n" + "\n".join(texts) + "\n")


def start(device):
    """Every rank's own tensor: [10 * rank, 10 * rank + 1]."""
    return torch.arange(2, device=device) + 10 * dist.get_rank()


def reductions(device):
    """broadcast, reduce and all_reduce (SUM, MAX, AVG), each on every rank's own tensor."""
    t = start(device)
    dist.broadcast(t, src=0)
    show_ranks("broadcast(t, src=0)", f"{start(device).tolist()} -> {t.tolist()}")

    t = start(device)
    # op=SUM by default; only the destination's result is defined. What the others' t holds is
    # shown once, to be seen and never read: it depends on the backend and its algorithm.
    dist.reduce(t, dst=0)
    result = f"{t.tolist()}" if dist.get_rank() == 0 else f"{t.tolist()} (undefined: do not read)"
    show_ranks("reduce(t, dst=0)", f"{start(device).tolist()} -> {result}")

    t = start(device)
    dist.all_reduce(t)
    show_ranks("all_reduce(t)", f"{start(device).tolist()} -> {t.tolist()}")

    t = start(device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    show_ranks("all_reduce(t, op=MAX)", f"{start(device).tolist()} -> {t.tolist()}")

    # AVG divides: a float tensor (gloo refuses AVG on an integer one). gloo has it too (torch
    # 2.13), not only nccl.
    t = start(device).float()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    show_ranks("all_reduce(t, op=AVG), t as float", f"{start(device).tolist()} -> {t.tolist()}")


def mean_over_uneven_samples(device):
    """A mean over samples when rank r holds r + 1 of them."""
    # AVG of the per-rank means weighs every rank alike; all-reducing (sum, count) with SUM weighs
    # every sample alike.
    rank = dist.get_rank()
    samples = torch.full((rank + 1,), 10.0 * rank, device=device)
    mean = samples.mean().reshape(1)
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    totals = torch.stack([samples.sum(), torch.tensor(float(samples.numel()), device=device)])
    # op=SUM
    dist.all_reduce(totals)
    show_ranks(
        "mean over all samples, rank r holding r + 1 of them",
        f"{samples.tolist()}: AVG of the means -> {mean.item():.2f}; SUM of (sum, count) -> "
        f"{totals[0].item():.0f}/{totals[1].item():.0f} = {(totals[0] / totals[1]).item():.2f}",
    )


def gathers(device):
    """all_gather and reduce_scatter; all_reduce == reduce_scatter, then all_gather."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gathered = [torch.empty(2, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(gathered, start(device))
    show_ranks("all_gather(list, t)", f"{start(device).tolist()} -> {[g.tolist() for g in gathered]}")

    chunks = list((torch.arange(2 * world_size, device=device) + 10 * rank).chunk(world_size))
    mine = torch.empty(2, dtype=torch.int64, device=device)
    dist.reduce_scatter(mine, chunks)
    show_ranks("reduce_scatter(out, list of chunks)", f"{[c.tolist() for c in chunks]} -> {mine.tolist()}")

    # The ring's two halves: gather what reduce_scatter left on each rank, compare with all_reduce.
    pieces = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(pieces, mine)
    whole = torch.cat(chunks)
    dist.all_reduce(whole)
    show_ranks("all_gather of the reduce_scatter results == all_reduce?", str(torch.equal(torch.cat(pieces), whole)))


def barrier_demo(out):
    """Rank 0 prepares a file (a download, say); the others wait at the barrier, then read it."""
    path = Path(out) / "c03_prepared_by_rank0.txt"
    if dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("data prepared by rank 0")
    dist.barrier()
    show_ranks("barrier()", f"reads {path.read_text()!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="work", help="folder for the barrier demo's file")
    args = parser.parse_args()
    device = setup()
    reductions(device)
    mean_over_uneven_samples(device)
    gathers(device)
    barrier_demo(args.out)


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
