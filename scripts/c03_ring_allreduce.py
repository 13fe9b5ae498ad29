"""Ring all-reduce with isend/irecv vs passing whole tensors vs dist.all_reduce."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

# The block taught above, in the file beside this one.
from c03_torchrun_environment import setup, teardown


def exchange(send_buf, recv_buf, right, left):
    """Send to the right and receive from the left at the same time, as one batch (nccl needs it)."""
    ops = [dist.P2POp(dist.isend, send_buf, right), dist.P2POp(dist.irecv, recv_buf, left)]
    for request in dist.batch_isend_irecv(ops):
        # Only once it returns may send_buf change and recv_buf be read.
        request.wait()


def ring_allreduce_(x):
    """Sum x over all ranks, in place: reduce-scatter, then all-gather. Returns bytes sent."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    # Views: writing a chunk writes x.
    chunks = x.view(-1).chunk(n)
    assert x.numel() % n == 0, "this version needs equal chunks"
    incoming = torch.empty_like(chunks[0])
    sent = 0
    # Reduce-scatter: add the left neighbour's partial sum.
    for s in range(n - 1):
        exchange(chunks[(rank - s) % n], incoming, right, left)
        chunks[(rank - s - 1) % n].add_(incoming)
        sent += chunks[0].numel() * x.element_size()
    # All-gather: pass the finished chunks on.
    for s in range(n - 1):
        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n], right, left)
        sent += chunks[0].numel() * x.element_size()
    return sent


def naive_allreduce_(x):
    """The tutorial version: pass whole tensors round the ring N-1 times. Returns bytes sent."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    passing, incoming = x.clone(), torch.empty_like(x)
    sent = 0
    for _ in range(n - 1):
        exchange(passing, incoming, right, left)
        x.add_(incoming)
        passing, incoming = incoming, passing
        sent += x.numel() * x.element_size()
    return sent


def timed(fn, x, repeats):
    """Median seconds of fn on a fresh copy of x."""
    times = []
    for _ in range(repeats):
        y = x.clone()
        dist.barrier()
        start = time.perf_counter()
        fn(y)
        if y.is_cuda:
            # nccl calls return before the GPU has finished.
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=int, help="elements per tensor (default: 2**18, made a multiple of N)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each version")
    args = parser.parse_args()
    n = int(os.environ.get("WORLD_SIZE", "1"))
    # This version needs N equal chunks.
    numel = args.numel or 2**18 // n * n
    if numel % n:
        parser.error(f"--numel must be divisible by the world size {n}")
    device = setup()
    rank = dist.get_rank()

    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(device)
    expected = x.clone()
    dist.all_reduce(expected)
    ring, naive = x.clone(), x.clone()
    sent = {"ring": ring_allreduce_(ring), "naive": naive_allreduce_(naive)}
    diff = {"ring": (ring - expected).abs().max().item(), "naive": (naive - expected).abs().max().item()}
    seconds = {
        "ring": timed(ring_allreduce_, x, args.repeats),
        "naive": timed(naive_allreduce_, x, args.repeats),
        "dist.all_reduce": timed(dist.all_reduce, x, args.repeats),
    }

    reports = [None] * n
    dist.all_gather_object(reports, (sent, diff))
    if rank == 0:
        S = x.numel() * x.element_size()
        atol = 1e-5
        lines = [f"backend={dist.get_backend()} device={device.type}, N={n}, S = {S / 1e6:.2f} MB per rank"]
        for r, (r_sent, _) in enumerate(reports):
            lines.append(f"rank {r} sent: ring {r_sent['ring'] / S:.3f} S, naive {r_sent['naive'] / S:.3f} S")
        lines.append(f"expected:     ring 2(N-1)/N = {2 * (n - 1) / n:.3f} S, naive N-1 = {n - 1:.3f} S")
        for name in ["ring", "naive"]:
            ok = all(r_diff[name] <= atol for _, r_diff in reports)
            lines.append(f"{name} vs dist.all_reduce on every rank: max |difference| <= {atol:g}: {ok}")
        lines.append("median time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in seconds.items()))
        sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
