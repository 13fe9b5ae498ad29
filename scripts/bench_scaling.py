"""Data-parallel scaling benchmark: one model, one global batch, throughput at 1..N processes.

    # the whole comparison
    python bench_scaling.py --model compute --nproc-list 1,2 --json scaling.json
    # DDP at this size only
    torchrun --standalone --nproc_per_node=2 bench_scaling.py --model small

Every measurement alternates, step by step, the configuration measured with the baseline: one
process training on the whole global batch (in a DDP job, rank 0 runs it alone while the others
wait), so that both see the same machine load; the speedup is the baseline's step time over the
configuration's. The global batch is the same everywhere: each of N processes takes global/N.
A job of N processes measures DDP on N, and DDP on one process (rank 0 in a group of its own:
DDP's own overhead, nothing to exchange). Plain `python` is a job of one process, plus
DataParallel (only with 2+ GPUs: on CPU it is skipped, and says why); --nproc-list 1,2,4 runs a
torchrun job for each N > 1 from this script (--standalone: a free port; bounded by --timeout).

On CPU every process gets --threads threads (default 1), so N processes use N cores: the
comparison is fair only if the machine has that many cores free. Two models:

- small:   a 21 k-parameter MLP, global batch 64: so little computation per step that the
           all-reduce's fixed cost and DDP's own work dominate: more processes are slower.
- compute: a 0.8 M-parameter MLP, global batch 2048 (per rank 1024 at N = 2): forward and
           backward take many times as long as the all-reduce of its 3 MB of gradients, so
           with N free cores N processes can approach N times the throughput.

For DDP on N > 1 it also splits a step: t_compute (the same step under no_sync(): no
communication), t_comm (all-reducing the gradients alone, in buckets sized as DDP's) and t_step
(the DDP step); overlap = (t_compute + t_comm - t_step) / t_comm: 1 = the communication is
entirely hidden behind backward, 0 = the two simply add up, below 0 = the DDP step is slower
than computing and then communicating one after the other (they compete for the same cores,
and DDP's copies into and out of its buckets belong to neither part alone). Times are medians
over --steps steps (after --warmup, which also covers DDP's bucket rebuild after its first
step), each the slowest rank's.

DDP's buckets (torch 2.13, find_unused_parameters=False): the first step runs with a single
bucket; the reducer then rebuilds them in the order the gradients became ready, closing a
bucket once it holds at least its cap. With --bucket-cap-mb unset (DDP's default) the first
bucket's cap is 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES) and the others' 25 MiB; with
--bucket-cap-mb C every cap is C MiB (torch/nn/parallel/distributed.py, _BucketCapacityConfig).
"""

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_setup import setup, teardown

# name: (layer widths, default global batch, loss)
MODELS = {"small": ([32, 128, 128, 1], 64, "mse"), "compute": ([256, 768, 768, 10], 2048, "cross_entropy")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "both"], default="both", help="default: both")
    parser.add_argument(
        "--global-batch-size",
        type=int,
        help="samples per step, all processes together (default: 64 for small, 2048 for compute)",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process (default 1)")
    parser.add_argument(
        "--bucket-cap-mb",
        type=float,
        help="DDP's bucket_cap_mb (default: unset, DDP's default: a 1 MiB first bucket, then 25 MiB)",
    )
    parser.add_argument("--nproc-list", help="plain python only: also run DDP with these process counts, e.g. 1,2")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per torchrun job (default 300)")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="print a summary line, not the table")
    args = parser.parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--steps and --threads must be at least 1, --warmup at least 0")
    if (args.bucket_cap_mb is not None and not args.bucket_cap_mb > 0) or not args.timeout > 0:
        parser.error("--bucket-cap-mb and --timeout must be positive")
    try:
        args.nprocs = sorted({int(n) for n in args.nproc_list.split(",")}) if args.nproc_list else [1]
    except ValueError:
        parser.error(f"--nproc-list takes process counts like 1,2,4, got {args.nproc_list!r}")
    if min(args.nprocs) < 1:
        parser.error(f"--nproc-list: process counts must be at least 1, got {args.nproc_list}")
    if args.nproc_list and ("RANK" in os.environ or world_size > 1):
        parser.error("--nproc-list launches torchrun itself: run it with plain python")
    args.models = list(MODELS) if args.model == "both" else [args.model]
    for name in args.models:
        batch = args.global_batch_size or MODELS[name][1]
        for n in args.nprocs + [world_size]:
            if batch < n or batch % n:
                parser.error(f"--global-batch-size {batch} is not divisible by {n} processes")
    if args.json is not None and args.json.is_dir():
        parser.error(f"--json {args.json} is a folder; give a file name")
    return args


def make_model(name, device):
    torch.manual_seed(0)
    widths = MODELS[name][0]
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(device)


def make_batch(name, batch, device, seed):
    widths, _, loss = MODELS[name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, widths[0], generator=g)
    y = torch.randn(batch, 1, generator=g) if loss == "mse" else torch.randint(0, widths[-1], (batch,), generator=g)
    return x.to(device), y.to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, optimizer, x, y, loss_name):
    optimizer.zero_grad(set_to_none=True)
    out = model(x)
    loss = F.mse_loss(out, y) if loss_name == "mse" else F.cross_entropy(out, y)
    loss.backward()
    optimizer.step()


def timed(fn, device):
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def alternate(variants, warmup, steps, device):
    """Run the variants in turn, step after step (each started together: a barrier), and return
    the median over steps of each one's time on the slowest rank (a step ends when the last rank
    is done). Alternating makes the variants share whatever load the machine has."""
    times = {key: [] for key in variants}
    for i in range(warmup + steps):
        for key, fn in variants.items():
            dist.barrier()
            t = timed(fn, device)
            if i >= warmup:
                times[key].append(t)
    table = torch.tensor([times[k] for k in variants], dtype=torch.float64, device=device)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return {key: statistics.median(row) for key, row in zip(variants, table.cpu().tolist())}


def baseline(name, batch, device):
    """One process on the whole global batch: a step function to alternate with the others."""
    model = make_model(name, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = make_batch(name, batch, device, seed=0)
    return lambda: train_step(model, optimizer, x, y, MODELS[name][2])


def with_speedup(result, batch, n):
    step_s, base_s = result["step_s"], result["one_process_s"]
    return {**result, "samples_per_s": batch / step_s, "speedup": base_s / step_s, "efficiency": base_s / step_s / n}


def data_parallel_run(name, batch, args, device):
    """DataParallel over all GPUs, alternated with one process on one GPU."""
    model = nn.DataParallel(make_model(name, device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = make_batch(name, batch, device, seed=0)
    variants = {
        "one_process_s": baseline(name, batch, device),
        "step_s": lambda: train_step(model, optimizer, x, y, MODELS[name][2]),
    }
    return with_speedup(alternate(variants, args.warmup, args.steps, device), batch, torch.cuda.device_count())


def bucket_sizes(param_bytes, cap_mb=None):
    """Bytes in each of DDP's buckets after its first step, from the parameters' sizes in bytes.

    DDP rebuilds its buckets after the first step in the order the gradients became ready (for
    these MLPs: the parameters in reverse), adding gradients to a bucket until it holds at least
    its cap. Caps: with cap_mb unset, 1 MiB for the first bucket and 25 MiB for the others;
    with cap_mb given, cap_mb MiB for all (torch/nn/parallel/distributed.py)."""
    cap = 25 * 2**20 if cap_mb is None else int(cap_mb * 2**20)
    # the first bucket's cap
    limit = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20) if cap_mb is None else cap
    sizes, current = [], 0
    for nbytes in reversed(param_bytes):
        current += nbytes
        if current >= limit:
            sizes.append(current)
            current, limit = 0, cap
    return sizes + [current] if current else sizes


def gradient_buckets(model, cap_mb, device):
    """Flat float32 tensors sized like DDP's buckets, for timing the all-reduces alone."""
    sizes = bucket_sizes([p.numel() * p.element_size() for p in model.parameters()], cap_mb)
    return [torch.zeros(s // 4, device=device) for s in sizes]


def idle():
    """What the other ranks run while rank 0 runs a one-process variant: nothing (they wait at the
    next barrier)."""


def one_process_variants(name, batch, args, device):
    """Rank 0's one-process variants: the baseline, and DDP on one process (rank 0 in a group of its
    own: DDP's own overhead, with nothing to exchange)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # new_group must be called by every rank, also those that are not in it
    group = dist.new_group([0]) if world_size > 1 else None
    if rank != 0:
        return {"one_process_s": idle, "ddp_one_s": idle}
    one_ddp = DDP(make_model(name, device), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
    one_optimizer = torch.optim.SGD(one_ddp.parameters(), lr=0.01)
    x1, y1 = make_batch(name, batch, device, seed=0)
    return {
        "one_process_s": baseline(name, batch, device),
        "ddp_one_s": lambda: train_step(one_ddp, one_optimizer, x1, y1, MODELS[name][2]),
    }


def ddp_variants(model, name, batch, args, device):
    """DDP on every rank, each on global/N samples: its step, the same step under no_sync()
    (the computation alone) and the all-reduces alone, in buckets sized as DDP's."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loss_name = MODELS[name][2]
    buckets = gradient_buckets(model, args.bucket_cap_mb, device)
    ddp_model = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    x, y = make_batch(name, batch // world_size, device, seed=1 + rank)

    def compute_only():
        with ddp_model.no_sync():
            train_step(ddp_model, optimizer, x, y, loss_name)

    def comm_only():
        for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
            work.wait()

    return {
        "step_s": lambda: train_step(ddp_model, optimizer, x, y, loss_name),
        "compute_s": compute_only,
        "comm_s": comm_only,
    }


def ddp_run(name, batch, args, device):
    """DDP at the current world size N and DDP on one process, each alternated step by step with
    the one-process baseline. For N > 1 also t_compute (no_sync), t_comm (the all-reduces alone)
    and their overlap. Returns {"1": ..., "N": ...}."""
    world_size = dist.get_world_size()
    variants = one_process_variants(name, batch, args, device)
    model = make_model(name, device)
    sizes = bucket_sizes([p.numel() * p.element_size() for p in model.parameters()], args.bucket_cap_mb)
    layout = {"buckets": len(sizes), "bucket_bytes": sizes}
    if world_size > 1:
        variants.update(ddp_variants(model, name, batch, args, device))
    t = alternate(variants, args.warmup, args.steps, device)
    one = {"step_s": t["ddp_one_s"], "one_process_s": t["one_process_s"], "overlap": None, **layout}
    results = {"1": with_speedup(one, batch, 1)}
    if world_size > 1:
        overlap = (t["compute_s"] + t["comm_s"] - t["step_s"]) / t["comm_s"]
        split = {"compute_s": t["compute_s"], "comm_s": t["comm_s"], "overlap": overlap}
        many = {"step_s": t["step_s"], "one_process_s": t["one_process_s"], **split, **layout}
        results[str(world_size)] = with_speedup(many, batch, world_size)
    return results


def launch(n, args, out):
    """DDP with n processes: this script under torchrun, killed with its workers after --timeout."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        __file__,
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        "--json",
        str(out),
        "--quiet",
    ]
    if args.bucket_cap_mb is not None:
        cmd += ["--bucket-cap-mb", str(args.bucket_cap_mb)]
    if args.global_batch_size:
        cmd += ["--global-batch-size", str(args.global_batch_size)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"bench_scaling: DDP with {n} processes did not finish within {args.timeout:g} s") from None
    if proc.returncode != 0:
        raise SystemExit(f"bench_scaling: DDP with {n} processes failed:\n" + err[-2000:])
    return json.loads(out.read_text())


def table(report):
    lines = []
    for name, m in report["models"].items():
        lines.append(
            f"# model={name}: {m['parameters']} parameters ({m['gradient_bytes'] / 2**20:.2f} MiB of "
            f"gradients), global batch {m['global_batch']}, {report['backend']} on {report['device']}"
        )
        lines.append(
            f"#{'configuration':<14} {'procs':>5} {'step(ms)':>9} {'1 proc(ms)':>10} {'speedup':>8} "
            f"{'effic.':>7} {'compute(ms)':>12} {'comm(ms)':>9} {'overlap':>8}"
        )
        rows = [("DataParallel", report["gpus"], m["data_parallel"])] if "step_s" in m["data_parallel"] else []
        rows += [("DDP", int(n), r) for n, r in m["ddp"].items()]
        for label, n, r in rows:
            extra = ""
            if r.get("overlap") is not None:
                extra = f" {1e3 * r['compute_s']:>12.2f} {1e3 * r['comm_s']:>9.2f} {r['overlap']:>8.2f}"
            lines.append(
                f" {label:<14} {n:>5} {1e3 * r['step_s']:>9.2f} {1e3 * r['one_process_s']:>10.2f} "
                f"{r['speedup']:>8.2f} {r['efficiency']:>7.0%}{extra}"
            )
        if "skipped" in m["data_parallel"]:
            lines.append(f" DataParallel skipped: {m['data_parallel']['skipped']}")
    lines.append("# 1 proc = one process on the whole batch, timed alternately with the row; speedup = 1 proc / step")
    if any(r.get("overlap") is not None for m in report["models"].values() for r in m["ddp"].values()):
        lines.append(
            "# overlap = (compute + comm - step) / comm: 1 = the all-reduces hidden behind backward, "
            "0 = the two add up, < 0 = the DDP step is slower than computing, then communicating "
            "(they compete for the same cores, and DDP's bucket copies are in neither part alone)"
        )
    return lines


def measure_here(args, device, launched, children):
    """The models measured in this job: their sizes, DDP at this world size (unless torchrun jobs
    to come measure it), and DataParallel (plain python with 2+ GPUs) or why not."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    models = {}
    for name in args.models:
        batch = args.global_batch_size or MODELS[name][1]
        model = make_model(name, device)
        m = {
            "global_batch": batch,
            "parameters": sum(p.numel() for p in model.parameters()),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "ddp": {},
        }
        # with torchrun jobs to come, they measure N = 1
        if launched or (1 in args.nprocs and not children):
            m["ddp"] = ddp_run(name, batch, args, device)
        if not launched and gpus >= 2:
            m["data_parallel"] = data_parallel_run(name, batch, args, device)
        else:
            m["data_parallel"] = {
                "skipped": "DataParallel needs 2+ GPUs; without them it runs the "
                "module once on the whole batch (device_ids is empty), nothing in parallel"
            }
        models[name] = m
    return models


def run_jobs(args, children) -> dict:
    """DDP with each process count of --nproc-list above 1: one torchrun job each, their reports by
    count. They run before this process touches a GPU: torch cannot give back a CUDA context, and a
    GPU in exclusive-process mode refuses every other process's while this one holds one."""
    # device_count() makes no CUDA context; with a GPU, plain python measures on cuda:0.
    gpus = torch.cuda.device_count()
    jobs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in children:
            if gpus and n > gpus:
                sys.stdout.write(f"# DDP with {n} processes skipped: only {gpus} GPU(s)\n")
                continue
            jobs[n] = launch(n, args, Path(tmp) / f"n{n}.json")
    return jobs


def merge_jobs(report, args, jobs) -> None:
    """The jobs' DDP measurements, merged into this process's report."""
    for n, child in jobs.items():
        for name in args.models:
            ddp = report["models"][name]["ddp"]
            ddp[str(n)] = child["models"][name]["ddp"][str(n)]
            if 1 in args.nprocs:
                # DDP on one process: from the first job
                ddp.setdefault("1", child["models"][name]["ddp"]["1"])
            report["models"][name]["ddp"] = dict(sorted(ddp.items(), key=lambda kv: int(kv[0])))


def summary(report, args, launched):
    """The one line --quiet prints."""
    ns = sorted({int(n) for m in report["models"].values() for n in m["ddp"]})
    parts = [f"bench_scaling {', '.join(args.models)}: backend={report['backend']} device={report['device']}"]
    if report["device"] == "cpu":
        parts.append(f"{args.threads} thread(s) per process")
    parts.append(f"measured DDP on {' and '.join(map(str, ns))} process(es), each against one process")
    if not launched and report["gpus"] < 2:
        parts.append("DataParallel skipped (needs 2+ GPUs)")
    if args.json:
        parts.append(f"wrote {args.json}")
    return "; ".join(parts)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    # under torchrun: DDP at this world size only
    launched = "RANK" in os.environ
    children = [n for n in args.nprocs if n > 1] if not launched else []
    jobs = run_jobs(args, children)
    device = setup()
    rank = dist.get_rank()
    report = {
        "backend": dist.get_backend(),
        "device": device.type,
        "gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
        "cpu_cores": os.cpu_count(),
        "threads_per_process": args.threads if device.type == "cpu" else None,
        "steps": args.steps,
        "warmup": args.warmup,
        "statistic": "median over steps of the slowest rank's time; every configuration alternated "
        "step by step with one process on the whole batch",
    }
    report["models"] = measure_here(args, device, launched, children)
    merge_jobs(report, args, jobs)
    if rank == 0:
        lines = []
        if device.type == "cpu":
            lines.append(
                f"# CPU: {args.threads} thread(s) per process (--threads), so N processes use N of "
                f"the {os.cpu_count()} cores; more processes than free cores is not a fair comparison"
            )
        lines += table(report)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")
            lines.append(f"# wrote {args.json}")
        if args.quiet:
            lines = [summary(report, args, launched)]
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
