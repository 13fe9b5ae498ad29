"""The six collectives, each printed before -> after in rank order from rank 0."""

import argparse
import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from c03_torchrun_environment import setup  # the block taught above (beside this file)


def show(title, text):
    """Gather one line per rank; rank 0 prints the title and the lines in rank order."""
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, f"  rank {dist.get_rank()}: {text}")
    if dist.get_rank() == 0:
        sys.stdout.write(title + "\n" + "\n".join(texts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="work", help="folder for the barrier demo's file")
    args = parser.parse_args()
    backend, device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def start():  # every rank's own tensor: [10 * rank, 10 * rank + 1]
        return torch.arange(2, device=device) + 10 * rank

    t = start()
    dist.broadcast(t, src=0)
    show("broadcast(t, src=0)", f"{start().tolist()} -> {t.tolist()}")

    t = start()
    dist.reduce(t, dst=0)  # op=SUM by default
    show("reduce(t, dst=0)", f"{start().tolist()} -> " + (f"{t.tolist()}" if rank == 0 else "(undefined: do not read)"))

    t = start()
    dist.all_reduce(t)
    show("all_reduce(t)", f"{start().tolist()} -> {t.tolist()}")

    t = start()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    show("all_reduce(t, op=MAX)", f"{start().tolist()} -> {t.tolist()}")

    t = start().float()  # AVG divides: a float tensor (gloo refuses AVG on an integer one)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # gloo too (torch 2.13), not only nccl
    show("all_reduce(t, op=AVG), t as float", f"{start().tolist()} -> {t.tolist()}")

    # A mean over samples when rank r holds r + 1 of them: AVG of the per-rank means weighs
    # every rank alike; all-reducing (sum, count) with SUM weighs every sample alike.
    samples = torch.full((rank + 1,), 10.0 * rank, device=device)
    mean = samples.mean().reshape(1)
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    totals = torch.stack([samples.sum(), torch.tensor(float(samples.numel()), device=device)])
    dist.all_reduce(totals)  # op=SUM
    show(
        "mean over all samples, rank r holding r + 1 of them",
        f"{samples.tolist()}: AVG of the means -> {mean.item():.2f}; SUM of (sum, count) -> "
        f"{totals[0].item():.0f}/{totals[1].item():.0f} = {(totals[0] / totals[1]).item():.2f}",
    )

    gathered = [torch.empty(2, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(gathered, start())
    show("all_gather(list, t)", f"{start().tolist()} -> {[g.tolist() for g in gathered]}")

    chunks = list((torch.arange(2 * world_size, device=device) + 10 * rank).chunk(world_size))
    mine = torch.empty(2, dtype=torch.int64, device=device)
    dist.reduce_scatter(mine, chunks)
    show("reduce_scatter(out, list of chunks)", f"{[c.tolist() for c in chunks]} -> {mine.tolist()}")

    # all_reduce == reduce_scatter, then all_gather: the ring's two halves
    pieces = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(pieces, mine)
    whole = torch.cat(chunks)
    dist.all_reduce(whole)
    show("all_gather of the reduce_scatter results == all_reduce?", str(torch.equal(torch.cat(pieces), whole)))

    # barrier: rank 0 prepares a file (a download, say); the others wait, then read it
    path = Path(args.out) / "c03_prepared_by_rank0.txt"
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("data prepared by rank 0")
    dist.barrier()
    show("barrier()", f"reads {path.read_text()!r}")


if __name__ == "__main__":
    main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
