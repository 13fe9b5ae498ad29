"""ZeRO-1 with ZeroRedundancyOptimizer: DDP + Adam against DDP + sharded Adam.

    torchrun --standalone --nproc_per_node=2 c08_zero1_optimizer.py [--steps 5]

Both runs start from the same weights and see the same data. Prints, gathered to rank 0:
parameters held per rank (DDP keeps a full replica: M1), optimizer-state bytes per rank
(ZeRO-1 keeps 1/N of them), and how far the two runs' weights are apart after --steps steps.
The chapter's other scripts, c08_fsdp.py and c08_fsdp_options.py, take the model and the
helpers from this one.
"""

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_setup import setup, teardown


def print0(text):
    """Print from rank 0 only, in one write (lines from several ranks never splice)."""
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def per_rank(value):
    """`value` from every rank, as a list in rank order (on every rank)."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


class Net(nn.Module):
    """An input layer, 4 residual blocks, and a head with 5 outputs (5 rows do not split evenly)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(32, 128)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(128, 128), nn.GELU()) for _ in range(4))
        self.head = nn.Linear(128, 5)

    def forward(self, x):
        h = F.gelu(self.inp(x))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def make_model(device):
    torch.manual_seed(0)
    return Net().to(device)


def state_bytes(optimizer):
    """Bytes of the tensors in an optimizer's state (exp_avg, exp_avg_sq, step)."""
    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


def train(model, optimizer, batches):
    """Train on `batches`; returns the loss of every step (this rank's, on its own batches)."""
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        # The loss in float32, whatever the model computes in: CUDA's mse_loss cannot take a
        # bfloat16 output and a float32 target through backward (the CPU promotes them).
        loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def report_memory(ddp_model, adam, zero):
    """Parameters held and Adam state bytes per rank, DDP + Adam against ZeRO-1 (printed by rank 0)."""
    counts = per_rank(sum(p.numel() for p in ddp_model.parameters()))
    print0(
        "DDP: parameters held per rank: "
        + ", ".join(f"rank {r}: {c:,}" for r, c in enumerate(counts))
        + "  (a full replica on every rank)"
    )
    owned = per_rank([sum(p.numel() for g in zero.optim.param_groups for p in g["params"])])
    full = per_rank(state_bytes(adam))
    # zero.optim: the local Adam over this rank's share of the parameters.
    sharded = per_rank(state_bytes(zero.optim))
    print0(f"{'rank':>4} | {'params it updates':>17} | {'Adam state, DDP':>15} | {'Adam state, ZeRO-1':>18} | share")
    for r in range(dist.get_world_size()):
        print0(
            f"{r:>4} | {owned[r][0]:>17,} | {full[r]:>9,} bytes | {sharded[r]:>12,} bytes | {sharded[r] / full[r]:.3f}"
        )
    print0(f"ZeRO-1 state summed over ranks: {sum(sharded):,} bytes (unsharded: {full[0]:,} bytes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    args = parser.parse_args()
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Each rank its own data.
    g = torch.Generator().manual_seed(1 + rank)
    batches = [
        (torch.randn(8, 32, generator=g).to(device), torch.randn(8, 5, generator=g).to(device))
        for _ in range(args.steps)
    ]

    # DDP + Adam: every rank holds all parameters and all of Adam's state.
    model = make_model(device)
    ddp_model = DDP(model)
    adam = torch.optim.Adam(ddp_model.parameters(), lr=1e-3)
    train(ddp_model, adam, batches)

    # DDP + ZeroRedundancyOptimizer(Adam): each rank keeps Adam's state for its share only.
    zero_model = DDP(make_model(device))
    zero = ZeroRedundancyOptimizer(zero_model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    train(zero_model, zero, batches)

    n_params = sum(p.numel() for p in model.parameters())
    print0(f"model: {n_params:,} parameters in {len(list(model.parameters()))} tensors, {world_size} ranks")
    report_memory(ddp_model, adam, zero)

    atol = 1e-6
    diff = max((a - b).abs().max().item() for a, b in zip(ddp_model.parameters(), zero_model.parameters()))
    worst = max(per_rank(diff))
    print0(
        f"after {args.steps} steps, ZeRO-1 weights vs DDP + Adam weights (all ranks): "
        f"{'PASS' if worst <= atol else 'FAIL'} max |difference| <= {atol:g}"
    )
    return 0 if worst <= atol else 1


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
