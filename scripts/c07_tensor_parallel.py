"""Tensor parallelism with torch.distributed.tensor.parallel: linear layers and an MLP split over
the ranks, checked against the unsplit ones, with the collectives each one runs counted.

    torchrun --standalone --nproc_per_node=2 c07_tensor_parallel.py

Every rank builds the same nn.Linear / MLP from a seed; parallelize_module replaces each weight
by a DTensor whose local shard is this rank's slice. Outputs and gradients (forward and
backward) must equal the unsplit layers'; CommDebugMode counts the collectives of each pass.
"""

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from dist_setup import setup, teardown

IN, HIDDEN, OUT, BATCH = 16, 32, 8, 4
ATOL = 1e-5
FAILED = []


def print0(text):
    """Print from rank 0 only, in one write (lines from several ranks never splice)."""
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def check(what, got, expected):
    """Compare on every rank; rank 0 prints one verdict for all of them."""
    # On the tensors' device: nccl reduces GPU tensors only.
    diff = torch.tensor([(got.detach() - expected.detach()).abs().max().item()], device=got.device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if diff.item() <= ATOL:
        print0(f"PASS {what}: max |difference| <= {ATOL:g}")
    else:
        FAILED.append(what)
        print0(f"FAIL {what}: max |difference| = {diff.item():.3g} > {ATOL:g}")


def counted(fn):
    """fn()'s result, and the collectives it ran: {"all_reduce": 1, ...} (CommDebugMode)."""
    with CommDebugMode() as mode:
        result = fn()
    names = {str(op).split(".")[-1].removesuffix("_into_tensor"): n for op, n in mode.get_comm_counts().items()}
    return result, names


def describe(counts):
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items())) or "no collective"


def compare(name, sharded, unsplit, x):
    """Forward and backward of `sharded` against `unsplit`; returns the collectives of each pass."""
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, forward = counted(lambda: sharded(x_tp))
    _, backward = counted(lambda: out.square().sum().backward())
    unsplit(x_ref).square().sum().backward()
    print0(f"{name}: forward ran {describe(forward)}, backward {describe(backward)}")
    check(f"{name} output", out, unsplit(x))
    check(f"{name} input gradient", x_tp.grad, x_ref.grad)
    for (param, p), q in zip(sharded.named_parameters(), unsplit.parameters()):
        check(f"{name} {param} gradient (full_tensor of the shards)", p.grad.full_tensor(), q.grad)
    return forward, backward


def one_layer_each_way(mesh, x, device):
    """Column: rows of W (output features), the output gathered. Row: columns of W (input
    features), the whole input sliced here, the partial outputs summed."""
    plans = {
        "column-parallel": ColwiseParallel(output_layouts=Replicate()),
        "row-parallel": RowwiseParallel(input_layouts=Replicate()),
    }
    for name, plan in plans.items():
        torch.manual_seed(1)
        linear = nn.Linear(IN, HIDDEN).to(device)
        sharded = parallelize_module(copy.deepcopy(linear), mesh, plan)
        w = sharded.weight
        print0(
            f"{name}: weight {tuple(w.shape)} as a {type(w).__name__}, placement {w.placements[0]!r}, "
            f"local shard {tuple(w.to_local().shape)}; bias placement {sharded.bias.placements[0]!r}"
        )
        compare(name, sharded, linear, x)


def the_mlp(mesh, x, device):
    """Column (its output stays sharded) -> ReLU on the shards -> row (takes them as they are):
    one all_reduce in forward, whatever the hidden size."""
    torch.manual_seed(2)
    mlp = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)).to(device)
    tp_mlp = parallelize_module(copy.deepcopy(mlp), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    forward, backward = compare("MLP column -> ReLU -> row", tp_mlp, mlp, x)
    # One rank holds everything: nothing to send.
    one = {"all_reduce": 1} if dist.get_world_size() > 1 else {}
    print0(
        f"{'PASS' if forward == one and backward == one else 'FAIL'} the MLP communicates once each way "
        "(on 2+ ranks): the row layer's sum in forward, the input's gradient in backward"
    )
    if forward != one or backward != one:
        FAILED.append("MLP collectives")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    # DTensor splits unevenly, but the MLP's two layers must agree: refused before joining the group.
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if IN % ranks or HIDDEN % ranks:
        fits = [n for n in range(1, HIDDEN + 1) if IN % n == 0 and HIDDEN % n == 0]
        parser.error(f"the layers split {IN} and {HIDDEN} features evenly: run on {fits} processes, not {ranks}")
    device = setup()
    world_size = dist.get_world_size()
    print0(f"{world_size} ranks, backend={dist.get_backend()} device={device.type}")
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    x = torch.randn(BATCH, IN, device=device)
    one_layer_each_way(mesh, x, device)
    the_mlp(mesh, x, device)
    return 1 if FAILED else 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
