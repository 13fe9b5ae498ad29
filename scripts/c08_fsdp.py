"""FSDP2: fully_shard a model over a 1-D device mesh, train it, and compare with one process.

    torchrun --standalone --nproc_per_node=2 c08_fsdp.py [--steps 5]

Prints, gathered to rank 0: what each rank stores (parameters, gradients, Adam state) under
fully_shard against the full model, and the trained weights against the same model trained
by a single process on the whole batch.
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

# The chapter's model and helpers, from c08_zero1_optimizer.py beside this file.
from c08_zero1_optimizer import make_model, per_rank, print0, train
from dist_setup import setup, teardown


def make_batches(steps, world_size, device):
    """The global batches, the same on every rank: 8 samples per rank each."""
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(8 * world_size, 32, generator=g).to(device),
            torch.randn(8 * world_size, 5, generator=g).to(device),
        )
        for _ in range(steps)
    ]


def train_sharded(mesh, batches, device):
    """FSDP2: shard each block, then the root (inp and head), over the mesh, and train on this
    rank's share of every batch. Returns the model, its optimizer and the global loss of each step."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_model(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # Built on the sharded parameters: its state is sharded too.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    my_batches = [(x[rank::world_size], y[rank::world_size]) for x, y in batches]
    losses = train(model, optimizer, my_batches)
    # Equal shares: the mean of the ranks' means is the global one.
    dist.all_reduce(losses, op=dist.ReduceOp.AVG)
    return model, optimizer, losses


def local(t):
    """The part of a tensor stored on this rank: a DTensor's local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors):
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def report_storage(model, optimizer):
    """What each rank stores, against the full model (printed by rank 0)."""
    world_size = dist.get_world_size()
    w = model.blocks[0][0].weight
    print0(
        f"a sharded parameter: {type(w).__name__}, global shape {tuple(w.shape)}, "
        f"placements {w.placements}, local shape on rank 0 {tuple(w.to_local().shape)}"
    )
    print0(f"head.weight (5 rows): local shapes per rank {per_rank(tuple(model.head.weight.to_local().shape))}")
    # A DTensor's numel is the global one.
    full_count = sum(p.numel() for p in model.parameters())
    counts = per_rank(sum(p.to_local().numel() for p in model.parameters()))
    # Adam's m and v: its step counters are scalars, not shards.
    adam_state = [
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0
    ]
    stored = per_rank((nbytes(model.parameters()), nbytes(p.grad for p in model.parameters()), nbytes(adam_state)))
    full = (4 * full_count, 4 * full_count, 8 * full_count)
    print0(f"full model: {full_count:,} parameters; {world_size} ranks")
    print0(
        f"{'rank':>4} | {'parameters':>10} | {'param bytes':>11} | {'grad bytes':>10} | "
        f"{'Adam m+v bytes':>14} | share of full"
    )
    for r in range(world_size):
        print0(
            f"{r:>4} | {counts[r]:>10,} | {stored[r][0]:>11,} | {stored[r][1]:>10,} | "
            f"{stored[r][2]:>14,} | {counts[r] / full_count:.4f}"
        )
    print0(
        f" all | {sum(counts):>10,} | {sum(s[0] for s in stored):>11,} | {sum(s[1] for s in stored):>10,} | "
        f"{sum(s[2] for s in stored):>14,} | (the full model: {full[0]:,} / {full[1]:,} / {full[2]:,})"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    args = parser.parse_args()
    device = setup()
    # A 1-D mesh: shard over all ranks.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    batches = make_batches(args.steps, dist.get_world_size(), device)

    # One process, the whole batch: what sharded data parallelism must equal.
    reference = make_model(device)
    reference_losses = train(reference, torch.optim.Adam(reference.parameters(), lr=1e-3), batches)
    model, optimizer, losses = train_sharded(mesh, batches, device)
    report_storage(model, optimizer)

    # The loss of every step, not the weights: Adam moves a weight by about lr a step whatever the
    # size of its gradient (above Adam's eps), so where a gradient is ~0, rounding in another
    # summation order can turn its step the other way, and two exact runs drift apart there by up
    # to about 2 lr a step (lr: 1e-3). The loss does not depend on those weights (their gradient is
    # ~0). float32 rounds at 6e-8; a sum of 128 products typically errs by sqrt(128) * 6e-8 ~ 7e-7,
    # at worst 128 * 6e-8 ~ 8e-6: hence 1e-5, relative.
    rtol = 1e-5
    diff = ((losses - reference_losses) / reference_losses).abs().max().item()
    print0(
        f"losses of the {args.steps} steps, FSDP vs one process on the whole batch: "
        f"{'PASS' if diff <= rtol else 'FAIL'} max relative difference <= {rtol:g}"
    )
    return 0 if diff <= rtol else 1


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
