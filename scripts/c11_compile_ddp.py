"""torch.compile and DDP: the graph split at DDP's buckets, the same losses, the compile time.

    torchrun --standalone --nproc_per_node=2 c11_compile_ddp.py [--backend aot_eager|inductor]

1. Graphs: a backend that only counts the graphs dynamo hands it. One process: one graph. DDP:
   dynamo's DDPOptimizer cuts the model into pieces of DDP's bucket size, so that a bucket's
   all-reduce can start while the rest of backward runs; its first piece is 1 MiB whatever the cap
   (of 1 MiB or more), DDP's first bucket only when bucket_cap_mb is unset
   (torch/_dynamo/backends/distributed.py).
2. Training: chapter 11's GPT with DDP for 8 steps, eager and compiled: the same losses, and how
   long the first compiled step (the compilation) takes against the others.

The process group comes from dist_setup.py, which must sit beside this file.
"""

import argparse
import logging
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_setup import setup, teardown
from parallel_course.gpt import GPT, AdditionTask, GPTConfig, answer_loss_sum


def print0(text):
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def model_on(device, cfg=None):
    # The same initial weights in every run.
    torch.manual_seed(5)
    return GPT(cfg or GPTConfig()).to(device)


def wrap(model, device, bucket_cap_mb=None):
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


def counting_backend(seen):
    """A torch.compile backend that compiles nothing: it keeps each graph dynamo hands it in
    ``seen`` and runs it as it is."""

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    return backend


def graphs(device):
    """How many graphs torch.compile makes of one forward: alone, and under DDP. A wider, deeper
    GPT (3.2 MB of float32 parameters), so that DDP's buckets (the first 1 MiB) are several; with
    bucket_cap_mb=25 DDP makes one bucket, but dynamo still cuts a first piece of 1 MiB."""
    cfg = GPTConfig(d_model=128, n_layers=4)
    x = AdditionTask(2).batch(torch.Generator().manual_seed(0), 4)[0].to(device)
    for name, make in [
        ("one process, no DDP", lambda: model_on(device, cfg)),
        ("DDP, default buckets", lambda: wrap(model_on(device, cfg), device)),
        ("DDP, bucket_cap_mb=1", lambda: wrap(model_on(device, cfg), device, bucket_cap_mb=1)),
        ("DDP, bucket_cap_mb=25", lambda: wrap(model_on(device, cfg), device, bucket_cap_mb=25)),
    ]:
        torch._dynamo.reset()
        seen = []
        model = make()
        compiled = torch.compile(model, backend=counting_backend(seen))
        # DDP sets its buckets in the order of step 1's gradients, from step 2 on.
        for _ in range(2):
            compiled(x).sum().backward()
        buckets = len(model.reducer._get_zeros_like_grad_buckets()) if isinstance(model, DDP) else "-"
        print0(f"  {name:22}: {len(seen)} graph(s); DDP's buckets: {buckets}")


def train(device, compiled, backend, steps=8):
    """Chapter 11's run with DDP; returns the losses and each step's time."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    model = wrap(model_on(device), device)
    step_fn = torch.compile(model, backend=backend) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    task, data, share = AdditionTask(2), torch.Generator().manual_seed(6), 8 // world_size
    losses, times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = task.batch(data, 8)
        x, y = (t[rank * share : (rank + 1) * share].to(device) for t in (x, y))
        loss_sum, count = answer_loss_sum(step_fn(x), y)
        # Equal counts on every rank: DDP's average is the global mean.
        (loss_sum / count).backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(loss_sum := loss_sum.detach())
        losses.append(loss_sum.item() / (count * world_size))
        times.append(time.perf_counter() - start)
    return losses, times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        default="aot_eager",
        choices=["aot_eager", "inductor"],
        help="torch.compile backend for the training (default: aot_eager)",
    )
    args = parser.parse_args()
    device = setup()
    # dynamo warns, once per rank, that it leaves DDP's profiler annotations out of the graph
    torch._logging.set_logs(dynamo=logging.ERROR)
    print0("1. Graphs torch.compile makes of one forward:")
    graphs(device)
    print0(f"2. DDP training, eager and compiled ({args.backend}), 8 steps:")
    eager, eager_times = train(device, False, args.backend)
    compiled, compiled_times = train(device, True, args.backend)
    worst = max(abs(a - b) / b for a, b in zip(compiled, eager))
    print0("  eager losses:    " + " ".join(f"{v:.4f}" for v in eager))
    print0("  compiled losses: " + " ".join(f"{v:.4f}" for v in compiled))
    print0(f"  compiled vs eager: max relative difference <= 1e-05: {worst <= 1e-5}")
    print0(
        f"  first compiled step (with the compilation): {compiled_times[0]:.2f} s; later steps, median: "
        f"compiled {statistics.median(compiled_times[1:]) * 1e3:.1f} ms, eager "
        f"{statistics.median(eager_times[1:]) * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
