"""All-reduce benchmark in the style of nccl-tests: time, algbw and busbw per message size.

    torchrun --standalone --nproc_per_node=2 bench_allreduce.py --json allreduce.json
    torchrun --standalone --nproc_per_node=2 bench_allreduce.py --impl both --max-bytes 16M
    # one process: runs, but there is nothing to exchange
    python bench_allreduce.py

For each size (from --min-bytes to --max-bytes, times --factor): checks the result once, runs
--warmup untimed all-reduces, then --iters timed ones, each started together (a barrier) and
timed to completion (torch.cuda.synchronize() on GPUs). The time of an iteration is the slowest
rank's (gathered from all ranks); the median over iterations is reported.

    algbw = bytes / time              busbw = algbw * 2(N-1)/N   (nccl-tests' definitions)

busbw is the rate at which each rank sends (and receives) in a ring all-reduce: compare it
with the hardware's bandwidth per direction, whatever N is. The alpha-beta model
t(S) = alpha + (2(N-1)/N) * S / beta is fitted by least squares on relative error (the course's
parallel_course.bandwidth.fit_alpha_beta, where the definitions above are written too): alpha is
the fixed cost of one all-reduce at this world size, beta the bus bandwidth it tends to for large
messages.

--impl ring times the course's own ring all-reduce (chapter 03) instead of dist.all_reduce; --impl
both times the two, alternating them size by size so that both see the same machine load.
"""

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dist_setup import setup, teardown
from parallel_course.bandwidth import algbw, busbw, fit_alpha_beta

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


def ring_allreduce(tensor):
    """Chapter 03's ring all-reduce, for any length: reduce-scatter, then all-gather, over N chunks
    (tensor_split: the first ones one element longer); at each step every rank sends one chunk to
    its right neighbour and receives one from its left, posted as one batch (chapter 03's grouping
    rule: nccl can deadlock on a send and a receive posted one by one)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return tensor
    right, left = (rank + 1) % n, (rank - 1) % n
    # views: writing a chunk writes `tensor`
    chunks = tensor.view(-1).tensor_split(n)
    for s in range(2 * (n - 1)):
        outgoing, arriving = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        # the first n - 1 steps add; the others copy finished chunks into place
        reducing = s < n - 1
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
    # Start together: a rank that arrives late would be timed as a slow collective.
    dist.barrier()
    sync(device)
    start = time.perf_counter()
    fn(tensor)
    sync(device)
    return time.perf_counter() - start


def message_sizes(min_bytes, max_bytes, factor):
    """From min_bytes to max_bytes, times factor each step, rounded down to whole float32 elements."""
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size - size % 4)
        size *= factor
    return sizes


def measure(fn, nbytes, device, warmup, iters):
    """Check one all-reduce of nbytes, warm up, then time iters of them: (result correct, median of
    the slowest rank's times)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x = torch.full((nbytes // 4,), float(rank + 1), device=device)
    fn(x)
    correct = bool((x == world_size * (world_size + 1) / 2).all())
    # zeros: repeated in-place sums stay finite
    x.zero_()
    for _ in range(warmup):
        fn(x)
    mine = torch.tensor([time_one(fn, x, device) for _ in range(iters)], dtype=torch.float64)
    # An all-reduce ends when the last rank is done: the slowest rank's time, iteration by iteration.
    slowest = mine.to(device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return correct, statistics.median(slowest.cpu().tolist())


def bandwidths(nbytes, seconds, world_size):
    """One row of the table: nccl-tests' algbw and busbw (parallel_course.bandwidth)."""
    return {
        "bytes": nbytes,
        "count": nbytes // 4,
        "time_s": seconds,
        "algbw_bytes_per_s": algbw(nbytes, seconds),
        "busbw_bytes_per_s": busbw(nbytes, seconds, world_size),
    }


def run_all(impls, sizes, device, args):
    """Every implementation at every size, alternating the implementations size by size (the same
    machine load for both): {impl: [rows]}, and whether every result was correct on every rank."""
    results = {impl: [] for impl in impls}
    checked = True
    for nbytes in sizes:
        for impl in impls:
            correct, seconds = measure(IMPLS[impl], nbytes, device, args.warmup, args.iters)
            checked &= correct
            results[impl].append(bandwidths(nbytes, seconds, dist.get_world_size()))
    ok = torch.tensor([1.0 if checked else 0.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return results, bool(ok.item())


def fit_line(fit, why, world_size):
    """The table's last line for one implementation: the fit, or why there is none."""
    if fit:
        return (
            f"# alpha-beta fit: alpha = {1e6 * fit['alpha_s']:.1f} us, "
            f"beta = {fit['beta_bytes_per_s'] / 1e9:.3f} GB/s (bus bandwidth)"
        )
    if world_size == 1:
        return "# one process: nothing is exchanged (busbw = 0); run under torchrun with 2+ processes"
    if "does not grow" in why:
        return (
            "# alpha-beta fit: the time does not grow with the size in this range "
            "(latency-bound): raise --max-bytes to see the bandwidth"
        )
    return f"# alpha-beta fit: not possible here ({why})"


def report_and_table(results, ok, device, args):
    """The JSON report (with each implementation's fit) and the table nccl-tests would print."""
    world_size, backend = dist.get_world_size(), dist.get_backend()
    report = {
        "world_size": world_size,
        "backend": backend,
        "device": device.type,
        "threads_per_process": args.threads,
        "warmup": args.warmup,
        "iters": args.iters,
        "statistic": "median over iterations of the slowest rank's time",
        "results_checked": ok,
        "impls": {},
    }
    lines = [
        (
            f"# all_reduce: {world_size} ranks, backend={backend} device={device.type}, float32 sum, "
            f"median of {args.iters} (after {args.warmup} warm-up)"
        )
    ]
    for impl, rows in results.items():
        fit, why = None, None
        try:
            line = fit_alpha_beta([r["bytes"] for r in rows], [r["time_s"] for r in rows], world_size)
            fit = {"alpha_s": line.alpha_s, "beta_bytes_per_s": line.beta_bytes_per_s}
        except ValueError as error:
            why = str(error)
        report["impls"][impl] = {"sizes": rows, "fit": fit, "no_fit": why}
        lines.append(f"# impl={impl}")
        lines.append(f"#{'size':>12} {'count':>10} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
        for r in rows:
            lines.append(
                f" {r['bytes']:>12} {r['count']:>10} {1e6 * r['time_s']:>10.1f} "
                f"{r['algbw_bytes_per_s'] / 1e9:>12.3f} {r['busbw_bytes_per_s'] / 1e9:>12.3f}"
            )
        lines.append(fit_line(fit, why, world_size))
    lines.append(f"# results checked against the expected sum: {'OK' if ok else 'WRONG'}")
    return report, lines


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = setup()
    impls = ["torch", "ring"] if args.impl == "both" else [args.impl]
    sizes = message_sizes(args.min_bytes, args.max_bytes, args.factor)
    results, ok = run_all(impls, sizes, device, args)
    if dist.get_rank() == 0:
        report, lines = report_and_table(results, ok, device, args)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")
            lines.append(f"# wrote {args.json}")
        if args.quiet:
            lines = [
                f"all_reduce {', '.join(impls)}: {dist.get_world_size()} ranks, backend={dist.get_backend()} "
                f"device={device.type}, {len(sizes)} sizes from {human(sizes[0])} to {human(sizes[-1])}, "
                f"results checked: {'OK' if ok else 'WRONG'}" + (f", wrote {args.json}" if args.json else "")
            ]
        sys.stdout.write("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
