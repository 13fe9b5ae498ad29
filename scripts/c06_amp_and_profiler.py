"""Chapter 06c: DDP with mixed precision, then a profiler trace of DDP steps.

    torchrun --standalone --nproc_per_node=2 c06_amp_and_profiler.py [--out DIR]

1. DDP + AMP: torch.autocast (bfloat16 on CPU; float16 with a GradScaler on CUDA), unscale_
   before clipping (M17); checks that the loss falls and that the replicas stay identical.
2. torch.profiler on rank 0 around 2 DDP steps (float32, small buckets so that several
   all-reduces run during backward): writes DIR/c06_trace_rank0.json (open it in
   https://ui.perfetto.dev or chrome://tracing) and DIR/c06_profile_ops.json (the busiest ops).
"""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from dist_setup import setup, teardown


def mlp(width, depth, classes, seed, device):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes)).to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def stderr_silenced():
    """The profiler's C++ side logs a line (with a timestamp) on every start and stop: hide them."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def amp_training(device, steps):
    """DDP + AMP, the order that matters: scale, backward, unscale_, clip, step, update."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    model = mlp(64, 2, 4, seed=0, device=device)
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.5)
    # float16 needs a GradScaler, bfloat16 does not
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64 * world_size, 64, generator=g)
    # a learnable rule
    y = x[:, :4].argmax(dim=1)
    x, y = x[rank::world_size].to(device), y[rank::world_size].to(device)
    losses = []
    for _ in range(steps):
        # forward and loss in low precision where it is safe; backward outside autocast
        with torch.autocast(device.type, dtype=amp_dtype):
            loss = F.cross_entropy(ddp_model(x), y)
        # DDP all-reduces the (scaled) gradients in here
        scaler.scale(loss).backward()
        # M17: unscale first, then clip
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), max_norm=1.0)
        # skips the step if a gradient is inf/NaN (the same on every rank)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world_size)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(replicas, flat)
    identical = all(torch.equal(r, replicas[0]) for r in replicas)
    return amp_dtype, scaler.is_enabled(), losses, identical


def profiled_steps(device, out, bucket_cap_mb):
    """Rank 0 records 2 DDP steps (after 3 untimed ones); every rank takes part in the steps."""
    rank = dist.get_rank()
    model = mlp(512, 6, 10, seed=0, device=device)
    ddp_model = DDP(model, bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(128, 512, generator=g).to(device)
    y = torch.randint(0, 10, (128,), generator=g).to(device)

    def step():
        with record_function("train_step"):
            loss = F.cross_entropy(ddp_model(x), y)
            with record_function("backward"):
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync(device)

    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities)
    if rank == 0:
        with stderr_silenced():
            prof.start()
    for _ in range(2):
        step()
    if rank != 0:
        return None
    with stderr_silenced():
        prof.stop()
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / "c06_trace_rank0.json"))
    return busiest_operators(prof, out)


def busiest_operators(prof, out):
    """Write the 15 busiest operators to out/c06_profile_ops.json; return the all-reduce launches per step."""
    ops = []
    for e in prof.key_averages():
        # our own labels, not operators
        if e.key in ("train_step", "backward"):
            continue
        ops.append(
            {
                "name": e.key,
                "calls": e.count,
                "self_cpu_us": e.self_cpu_time_total,
                "self_device_us": getattr(e, "self_device_time_total", 0),
            }
        )
    ops.sort(key=lambda o: -(o["self_device_us"] or o["self_cpu_us"]))
    (out / "c06_profile_ops.json").write_text(json.dumps(ops[:15], indent=1) + "\n")
    launches = next((o["calls"] for o in ops if o["name"] == "c10d::allreduce_"), 0)
    return launches // 2


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("work"), help="folder for the trace (default: work)")
    parser.add_argument("--steps", type=int, default=20, help="DDP + AMP training steps (default 20)")
    parser.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP bucket size while profiling (default 1)")
    args = parser.parse_args()
    if args.steps < 2 or not args.bucket_cap_mb > 0:
        parser.error("--steps must be at least 2 and --bucket-cap-mb positive")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    return args


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = setup()
    amp_dtype, scaled, losses, identical = amp_training(device, args.steps)
    per_step = profiled_steps(device, args.out, args.bucket_cap_mb)
    if dist.get_rank() == 0:
        dtype = str(amp_dtype).replace("torch.", "")
        print(
            f"DDP + AMP: {dist.get_world_size()} ranks, backend={dist.get_backend()} device={device.type}, "
            f"autocast dtype={dtype}, GradScaler {'on' if scaled else 'off (not needed)'}"
        )
        print(
            f"  loss fell over {args.steps} steps: {'yes' if losses[-1] < 0.8 * losses[0] else 'no'}; "
            f"replicas identical: {'yes' if identical else 'NO'}"
        )
        print(
            f"profile: 2 DDP steps on rank 0 (float32, bucket_cap_mb={args.bucket_cap_mb:g}): "
            f"{per_step} all-reduce launches per step"
        )
        print(f"  wrote {args.out / 'c06_trace_rank0.json'} and {args.out / 'c06_profile_ops.json'}")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
