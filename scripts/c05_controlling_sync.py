"""Inside DDP, part 2: no_sync() and gradient accumulation, unused parameters, buffers.

torchrun --standalone --nproc_per_node=2 c05_controlling_sync.py
"""

import argparse
import contextlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

# The helpers of part 1, in the file beside this one.
from c05_ddp_internals import gathered, print0
from dist_setup import setup, teardown
from parallel_course.compat import ddp_buffer_sync


def small_model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)


def accumulation(device, rank, world_size):
    accum_steps, micro_batch = 4, 8
    global_batch = world_size * accum_steps * micro_batch
    # The same data on every rank; each takes its share.
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(global_batch, 8, generator=g).to(device), torch.randn(global_batch, 1, generator=g).to(device)

    # One process, one large batch.
    reference = small_model(device)
    F.mse_loss(reference(X), Y).backward()
    ref_grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])

    # This rank's accum_steps * micro_batch samples.
    mine = X[rank::world_size], Y[rank::world_size]
    calls = [0]

    def counting_hook(state, bucket):
        calls[0] += 1
        return allreduce_hook(state, bucket)

    results = {}
    for name, use_no_sync, scale in [
        ("no_sync, loss / accum_steps", True, True),
        ("no_sync, loss NOT scaled", True, False),
        ("no no_sync, loss / accum_steps", False, True),
    ]:
        ddp_model = DDP(small_model(device))
        ddp_model.register_comm_hook(None, counting_hook)
        calls[0] = 0
        for k in range(accum_steps):
            x, y = (t[k * micro_batch : (k + 1) * micro_batch] for t in mine)
            last = k == accum_steps - 1
            # no_sync(): backward() only accumulates into .grad; the all-reduce happens in the
            # first backward() outside it, and then averages the accumulated sum.
            ctx = ddp_model.no_sync() if (use_no_sync and not last) else contextlib.nullcontext()
            with ctx:
                loss = F.mse_loss(ddp_model(x), y)
                (loss / accum_steps if scale else loss).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in ddp_model.parameters()])
        results[name] = (grad, calls[0])
    for name, (grad, n_calls) in results.items():
        diff = (grad - ref_grad).abs().max().item()
        verdict = (
            "equal within 1e-06" if diff <= 1e-6 else f"NOT equal: {grad.norm() / ref_grad.norm():.2f} times the norm"
        )
        print0(f"  {name:31s}: {n_calls} all-reduce(s) per optimizer step; gradient vs the large batch: {verdict}")


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)
        # Used only when asked: unused in this training loop.
        self.aux_head = nn.Linear(16, 1)

    def forward(self, x, use_aux=False):
        h = torch.relu(self.body(x))
        return self.aux_head(h) if use_aux else self.head(h)


def unused_parameters(device, rank):
    x, y = torch.randn(8, 8).to(device), torch.randn(8, 1).to(device)
    torch.manual_seed(0)
    ddp_model = DDP(TwoHeads().to(device))
    for step in range(2):
        try:
            F.mse_loss(ddp_model(x), y).backward()
            print0(f"  default DDP, step {step}: ok")
        except RuntimeError as e:
            lines = str(e).splitlines()
            print0(f"  default DDP, step {step}: RuntimeError: {lines[0][:112]}...")
            print0("    " + next(line for line in lines if line.startswith("Parameter indices")).strip())
            break
    print0(f"    (parameter indices 0-5 are {', '.join(n for n, _ in ddp_model.module.named_parameters())})")
    torch.manual_seed(0)
    # NEW: the fix.
    ddp_model = DDP(TwoHeads().to(device), find_unused_parameters=True)
    for _ in range(3):
        F.mse_loss(ddp_model(x), y).backward()
    print0(
        f"  find_unused_parameters=True: 3 steps ok; aux_head.weight.grad is "
        f"{'None' if ddp_model.module.aux_head.weight.grad is None else 'a tensor'}"
    )


def bn_model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).to(device)


def buffer_sync(device, mine):
    # The flag that this torch has, and a one-line note where it is not forward_sync_buffers.
    keyword, note = ddp_buffer_sync(True)
    if note:
        print0(note)
    for broadcast in [True, False]:
        if "forward_sync_buffers" in keyword:
            ddp_model = DDP(bn_model(device), forward_sync_buffers=broadcast)
        else:
            # torch < 2.13: broadcast_buffers=
            ddp_model = DDP(bn_model(device), broadcast_buffers=broadcast)
        # The running mean that forward() starts from, on this rank.
        seen = []
        ddp_model.module[1].register_forward_pre_hook(lambda m, args, seen=seen: seen.append(m.running_mean.clone()))
        for _ in range(3):
            ddp_model(mine).sum().backward()
        starts = gathered(seen[-1])
        print0(
            f"  forward_sync_buffers={broadcast!s:5}: BatchNorm running_mean at the start of forward, step 2: "
            + "; ".join(f"rank {r}: {[round(v, 2) for v in s.tolist()]}" for r, s in enumerate(starts))
        )


def batch_statistics(device, X, mine):
    # Each rank normalises with ITS OWN batch's mean and variance.
    means = gathered(mine.mean(0))
    print0(
        f"  per-rank batch means of feature 0: {[round(m[0].item(), 2) for m in means]}; "
        f"of the whole batch: {round(X.mean(0)[0].item(), 2)}"
    )
    # SyncBatchNorm computes the statistics over all ranks' batches, but only on accelerators
    # (CUDA, XPU, HPU, ...).
    try:
        nn.SyncBatchNorm(4).to(device)(mine)
        print0(f"  SyncBatchNorm on {device.type}: ran")
    except ValueError as e:
        print0(f"  SyncBatchNorm on {device.type}: ValueError: {e}")
    # What SyncBatchNorm computes, by hand: all-reduce (sum, sum of squares, count).
    stats = torch.cat([mine.sum(0), (mine * mine).sum(0), torch.tensor([float(len(mine))], device=device)])
    dist.all_reduce(stats)
    # stats[-1]: the count.
    mean = stats[:4] / stats[-1]
    var = stats[4:8] / stats[-1] - mean * mean
    full_mean, full_var = X.mean(0), X.var(0, unbiased=False)
    ok = max((mean - full_mean).abs().max().item(), (var - full_var).abs().max().item()) <= 1e-5
    print0(
        "  by hand, all_reduce of (sum, sum of squares, count): "
        f"mean and variance equal the whole batch's within 1e-05: {ok}"
    )


def buffers(device, rank, world_size):
    g = torch.Generator().manual_seed(7)
    X = torch.randn(world_size * 16, 4, generator=g).to(device)
    # Rank 1's data sits elsewhere: per-rank batch statistics differ.
    X[16:] += 3.0
    mine = X[rank * 16 : (rank + 1) * 16]
    buffer_sync(device, mine)
    batch_statistics(device, X, mine)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print0("1. Gradient accumulation over 4 micro-batches vs one large batch:")
    accumulation(device, rank, world_size)
    print0("2. A parameter that takes no part in the loss:")
    unused_parameters(device, rank)
    print0("3. Buffers and BatchNorm:")
    buffers(device, rank, world_size)


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
