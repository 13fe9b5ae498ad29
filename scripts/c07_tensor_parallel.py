"""Tensor parallelism: column- and row-parallel linear layers by hand, then torch's tensor.parallel.

    torchrun --standalone --nproc_per_node=2 c07_tensor_parallel.py

Every rank builds the same nn.Linear / MLP from a seed and keeps a slice of each weight. The
sharded layers must give the unsplit layers' outputs and gradients (forward and backward).
"""
import argparse
import gc
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

IN, HIDDEN, OUT, BATCH = 16, 32, 8, 4
ATOL = 1e-5


def free_port():
    """A port the operating system says is free (plain `python` runs): never a fixed number."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def setup():
    """Backend and device from what is present; works under torchrun and as plain python."""
    for key, value in [("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", free_port())]:
        os.environ.setdefault(key, value)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=30))
    return device


def print0(text):
    """Print from rank 0 only, in one write (lines from several ranks never splice)."""
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def check(what, got, expected):
    """Compare on every rank; rank 0 prints one verdict for all of them."""
    diff = torch.tensor([(got.detach() - expected.detach()).abs().max().item()], device=got.device)  # nccl: on the GPU
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if diff.item() <= ATOL:
        print0(f"PASS {what}: max |difference| <= {ATOL:g}")
    else:
        print0(f"FAIL {what}: max |difference| = {diff.item():.3g} > {ATOL:g}")


# --- the communication, as autograd functions (Megatron-LM's f and g) ----------------------

class CopyToShards(torch.autograd.Function):
    """Forward: the input as it is (every rank holds all of it). Backward: sum the ranks' gradients."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class GatherShards(torch.autograd.Function):
    """Forward: concatenate every rank's slice of the last dimension. Backward: keep my slice."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()].contiguous()


class ScatterToShards(torch.autograd.Function):
    """Forward: keep my slice of the last dimension. Backward: gather every rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()].contiguous()

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.cat(parts, dim=-1)


class SumShards(torch.autograd.Function):
    """Forward: all_reduce the partial results. Backward: the gradient as it is (already everywhere)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's rows (the output features) split over the ranks."""

    def __init__(self, linear, gather_output=True):
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, dim=0)[rank].clone())
        self.gather_output = gather_output

    def forward(self, x):
        y = F.linear(CopyToShards.apply(x), self.weight, self.bias)  # my output features
        return GatherShards.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's columns (the input features) split over the ranks."""

    def __init__(self, linear, input_is_sharded=False):
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())     # added once, after the sum
        self.input_is_sharded = input_is_sharded

    def forward(self, x):
        if not self.input_is_sharded:                                  # take my input features
            x = ScatterToShards.apply(x)
        partial = F.linear(x, self.weight)                             # my share of every output
        return SumShards.apply(partial) + self.bias


def my_slice(tensor, dim):
    return tensor.chunk(dist.get_world_size(), dim=dim)[dist.get_rank()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    device = setup()
    world_size = dist.get_world_size()
    print0(f"{world_size} ranks, backend={dist.get_backend()} device={device.type}")
    torch.manual_seed(0)
    x = torch.randn(BATCH, IN, device=device)

    # 1. one column-parallel and one row-parallel layer against nn.Linear
    for name, Parallel, dim in [("column", ColumnParallelLinear, 0), ("row", RowParallelLinear, 1)]:
        torch.manual_seed(1)
        linear = nn.Linear(IN, HIDDEN).to(device)
        sharded = Parallel(linear)
        x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
        linear(x_ref).square().sum().backward()
        sharded(x_tp).square().sum().backward()
        check(f"{name}-parallel output", sharded(x), linear(x))
        check(f"{name}-parallel weight gradient (my slice)", sharded.weight.grad, my_slice(linear.weight.grad, dim))
        check(f"{name}-parallel input gradient", x_tp.grad, x_ref.grad)

    # 2. an MLP: column (no gather) -> ReLU -> row (sharded input): one all_reduce forward
    torch.manual_seed(2)
    mlp = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)).to(device)
    tp_mlp = nn.Sequential(ColumnParallelLinear(mlp[0], gather_output=False), nn.ReLU(),
                           RowParallelLinear(mlp[2], input_is_sharded=True))
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    calls = []                                                        # count the collectives
    original = dist.all_reduce
    dist.all_reduce = lambda *a, **k: calls.append("all_reduce") or original(*a, **k)
    out = tp_mlp(x_tp)
    forward_calls = len(calls)
    out.square().sum().backward()
    dist.all_reduce = original
    mlp(x_ref).square().sum().backward()
    print0(f"MLP column -> ReLU -> row: {forward_calls} all_reduce in forward (the row layer's sum), "
           f"{len(calls) - forward_calls} in backward (the input's gradient)")
    check("MLP output", out, mlp(x))
    check("MLP input gradient", x_tp.grad, x_ref.grad)
    check("MLP first-layer weight gradient (my rows)", tp_mlp[0].weight.grad, my_slice(mlp[0].weight.grad, 0))
    check("MLP second-layer weight gradient (my columns)", tp_mlp[2].weight.grad, my_slice(mlp[2].weight.grad, 1))

    # 3. the same MLP with torch.distributed.tensor.parallel on a device mesh
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    torch.manual_seed(2)
    dt_mlp = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)).to(device)
    dt_mlp = parallelize_module(dt_mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    print0(f"parallelize_module: first weight is a {type(dt_mlp[0].weight).__name__} "
           f"{tuple(dt_mlp[0].weight.shape)} with local shard {tuple(dt_mlp[0].weight.to_local().shape)}, "
           f"placements {dt_mlp[0].weight.placements} / {dt_mlp[2].weight.placements}")
    out = dt_mlp(x)
    out.square().sum().backward()
    check("ColwiseParallel/RowwiseParallel MLP output", out, mlp(x))
    check("its first-layer weight gradient (full tensor)", dt_mlp[0].weight.grad.full_tensor(), mlp[0].weight.grad)
    check("its second-layer weight gradient (full tensor)", dt_mlp[2].weight.grad.full_tensor(), mlp[2].weight.grad)


if __name__ == "__main__":
    main()
    gc.collect()  # main()'s DDP/FSDP objects are gone: the group is released here, not at exit,
    dist.destroy_process_group()  # where gloo's threads torn down during shutdown can abort the process
