"""All-reduce benchmark in the style of nccl-tests: time, algbw and busbw per message size.

    torchrun --standalone --nproc_per_node=2 bench_allreduce.py --json allreduce.json
    torchrun --standalone --nproc_per_node=2 bench_allreduce.py --impl both --max-bytes 16M
    python bench_allreduce.py            # one process: runs, but there is nothing to exchange

For each size (from --min-bytes to --max-bytes, times --factor): checks the result once, runs
--warmup untimed all-reduces, then --iters timed ones, each started together (a barrier) and
timed to completion (torch.cuda.synchronize() on GPUs). The time of an iteration is the slowest
rank's (gathered from all ranks); the median over iterations is reported.

    algbw = bytes / time              busbw = algbw * 2(N-1)/N   (nccl-tests' definitions)

busbw is the rate at which each rank sends (and receives) in a ring all-reduce: compare it
with the hardware's bandwidth per direction, whatever N is. The alpha-beta model
t(S) = alpha + (2(N-1)/N) * S / beta is fitted by least squares on relative error (the same fit
as the course's parallel_course.perf.fit_alpha_beta, copied so that this script stands alone):
alpha is the fixed cost of one all-reduce at this world size, beta the bus bandwidth it tends to
for large messages.

--impl ring times the course's own ring all-reduce (chapter 03) instead of dist.all_reduce; --impl
both times the two, alternating them size by size so that both see the same machine load.
"""

import argparse
import gc
import json
import os
import re
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


def size_arg(text):
    """'64M' -> 67108864 (K, M, G are powers of 2, as in nccl-tests)."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?B?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1024, 1K, 64M)")
    return int(m.group(1)) * UNITS[m.group(2)]


def human(nbytes):
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=size_arg, default=size_arg("1K"), help="smallest message (default 1K)")
    parser.add_argument("--max-bytes", type=size_arg, default=size_arg("64M"), help="largest message (default 64M)")
    parser.add_argument("--factor", type=int, default=2, help="size multiplier between steps (default 2)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size (default 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size (default 20)")
    parser.add_argument(
        "--impl",
        choices=["torch", "ring", "both"],
        default="torch",
        help="dist.all_reduce (torch), the course's ring (chapter 03), or both (default torch)",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process (default 1)")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="print a summary line, not the table")
    args = parser.parse_args(argv)
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes:
        parser.error(f"need 4 <= --min-bytes <= --max-bytes, got {args.min_bytes} and {args.max_bytes}")
    if args.factor < 2:
        parser.error(f"--factor must be at least 2, got {args.factor}")
    if args.warmup < 0 or args.iters < 1 or args.threads < 1:
        parser.error("--warmup must be >= 0, --iters and --threads >= 1")
    if args.json is not None and args.json.is_dir():
        parser.error(f"--json {args.json} is a folder; give a file name")
    return args


def free_port():
    """A port the operating system says is free (plain `python` runs): never a fixed number."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def setup():
    """Backend and device from what is present; works under torchrun and as plain python."""
    for key, value in [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", free_port()),
    ]:
        os.environ.setdefault(key, value)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    # nccl: bind the group to this process's GPU (its communicator is made now, barrier() uses it)
    dist.init_process_group(backend, timeout=timedelta(seconds=30), device_id=device if backend == "nccl" else None)
    return device


def ring_allreduce(tensor):
    """Chapter 03's ring all-reduce, for any length: reduce-scatter, then all-gather, over N chunks
    (tensor_split: the first ones one element longer); at each step every rank sends one chunk to
    its right neighbour and receives one from its left, posted as one batch (chapter 03's grouping
    rule: nccl can deadlock on a send and a receive posted one by one)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return tensor
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)  # views: writing a chunk writes `tensor`
    for s in range(2 * (n - 1)):
        outgoing, arriving = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        reducing = s < n - 1  # the first n - 1 steps add; the others copy finished chunks into place
        buffer = torch.empty_like(arriving) if reducing else arriving
        ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, buffer, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        if reducing:
            arriving.add_(buffer)
    return tensor


IMPLS = {"torch": lambda t: dist.all_reduce(t), "ring": ring_allreduce}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_one(fn, tensor, device):
    dist.barrier()  # start together: a rank that arrives late would be timed as a slow collective
    sync(device)
    start = time.perf_counter()
    fn(tensor)
    sync(device)
    return time.perf_counter() - start


def fit_alpha_beta(sizes, times, world_size):
    """Least squares of t = alpha + (2(N-1)/N) * S / beta, on relative error (weights 1/t).

    Returns {"alpha_s": ..., "beta_bytes_per_s": ...}; raises ValueError when there is nothing to
    fit (as parallel_course.perf.fit_alpha_beta does, with the same messages).
    """
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("need at least two (size, time) points, as many sizes as times")
    if world_size < 2:
        raise ValueError("one rank exchanges nothing: fit the model to 2 or more ranks")
    if min(times) <= 0:
        raise ValueError("times must be positive")
    if len(set(sizes)) < 2:
        raise ValueError("need at least two different sizes")
    k = 2 * (world_size - 1) / world_size
    # minimise sum(((a + b*S - t) / t)^2): linear least squares in (a, b) with rows scaled by 1/t
    s11 = sum(1 / t**2 for t in times)
    s12 = sum(s / t**2 for s, t in zip(sizes, times))
    s22 = sum(s * s / t**2 for s, t in zip(sizes, times))
    r1 = sum(1 / t for t in times)
    r2 = sum(s / t for s, t in zip(sizes, times))
    det = s11 * s22 - s12 * s12
    a = (r1 * s22 - r2 * s12) / det
    b = (s11 * r2 - s12 * r1) / det
    if not b > 0:
        raise ValueError("the time does not grow with the size: no bandwidth to fit")
    return {"alpha_s": a, "beta_bytes_per_s": k / b}


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = setup()
    backend = dist.get_backend()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    impls = ["torch", "ring"] if args.impl == "both" else [args.impl]
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size - size % 4)  # float32 elements
        size *= args.factor
    bus_factor = 2 * (world_size - 1) / world_size

    results = {impl: [] for impl in impls}
    checked = True
    for nbytes in sizes:
        for impl in impls:  # alternate the implementations size by size: same machine load
            fn = IMPLS[impl]
            x = torch.full((nbytes // 4,), float(rank + 1), device=device)
            fn(x)
            checked &= bool((x == world_size * (world_size + 1) / 2).all())
            x.zero_()  # zeros: repeated in-place sums stay finite
            for _ in range(args.warmup):
                fn(x)
            mine = torch.tensor([time_one(fn, x, device) for _ in range(args.iters)], dtype=torch.float64)
            slowest = mine.to(device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # an all-reduce ends when the last rank is done
            t = statistics.median(slowest.cpu().tolist())
            algbw = nbytes / t
            results[impl].append(
                {
                    "bytes": nbytes,
                    "count": nbytes // 4,
                    "time_s": t,
                    "algbw_bytes_per_s": algbw,
                    "busbw_bytes_per_s": algbw * bus_factor,
                }
            )
    ok = torch.tensor([1.0 if checked else 0.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)

    if rank == 0:
        report = {
            "world_size": world_size,
            "backend": backend,
            "device": device.type,
            "threads_per_process": args.threads,
            "warmup": args.warmup,
            "iters": args.iters,
            "statistic": "median over iterations of the slowest rank's time",
            "results_checked": bool(ok.item()),
            "impls": {},
        }
        lines = [
            (
                f"# all_reduce: {world_size} ranks, backend={backend} device={device.type}, float32 sum, "
                f"median of {args.iters} (after {args.warmup} warm-up)"
            )
        ]
        for impl in impls:
            fit, why = None, None
            try:
                fit = fit_alpha_beta(
                    [r["bytes"] for r in results[impl]], [r["time_s"] for r in results[impl]], world_size
                )
            except ValueError as error:
                why = str(error)
            report["impls"][impl] = {"sizes": results[impl], "fit": fit, "no_fit": why}
            lines.append(f"# impl={impl}")
            lines.append(f"#{'size':>12} {'count':>10} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
            for r in results[impl]:
                lines.append(
                    f" {r['bytes']:>12} {r['count']:>10} {1e6 * r['time_s']:>10.1f} "
                    f"{r['algbw_bytes_per_s'] / 1e9:>12.3f} {r['busbw_bytes_per_s'] / 1e9:>12.3f}"
                )
            if fit:
                lines.append(
                    f"# alpha-beta fit: alpha = {1e6 * fit['alpha_s']:.1f} us, "
                    f"beta = {fit['beta_bytes_per_s'] / 1e9:.3f} GB/s (bus bandwidth)"
                )
            elif world_size == 1:
                lines.append("# one process: nothing is exchanged (busbw = 0); run under torchrun with 2+ processes")
            elif "does not grow" in why:
                lines.append(
                    "# alpha-beta fit: the time does not grow with the size in this range "
                    "(latency-bound): raise --max-bytes to see the bandwidth"
                )
            else:
                lines.append(f"# alpha-beta fit: not possible here ({why})")
        lines.append(f"# results checked against the expected sum: {'OK' if ok.item() else 'WRONG'}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")
            lines.append(f"# wrote {args.json}")
        if args.quiet:
            lines = [
                f"all_reduce {', '.join(impls)}: {world_size} ranks, backend={backend} device={device.type}, "
                f"{len(sizes)} sizes from {human(sizes[0])} to {human(sizes[-1])}, "
                f"results checked: {'OK' if ok.item() else 'WRONG'}" + (f", wrote {args.json}" if args.json else "")
            ]
        sys.stdout.write("\n".join(lines) + "\n")
    return 0 if ok.item() else 1


if __name__ == "__main__":
    exit_code = main()
    gc.collect()  # main() has returned: free what it built on the group (DDP and FSDP models, optimizers),
    dist.destroy_process_group()  # so the group ends now: one alive at exit can abort the process (gloo)
    sys.exit(exit_code)
