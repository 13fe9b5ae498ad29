"""Data-parallel scaling benchmark: one model, one global batch, throughput at 1..N processes.

    python bench_scaling.py --model compute --nproc-list 1,2 --json scaling.json   # the whole comparison
    torchrun --standalone --nproc_per_node=2 bench_scaling.py --model small        # DDP at this size only

Plain `python` measures one process (no DDP), DataParallel (only with 2+ GPUs: on CPU it is
skipped, and says why) and DDP in one process; --nproc-list 1,2,4 adds DDP with each N > 1,
each a torchrun job launched by this script (--standalone: a free port; bounded by --timeout).
The global batch is the same everywhere: each of N processes takes global/N samples.

On CPU every process gets --threads threads (default 1), so N processes use N cores: the
comparison is fair only if the machine has that many cores free. Two models:

- small:   a 21 k-parameter MLP, global batch 64. A step is a fraction of a millisecond of
           compute, so the all-reduce's fixed cost dominates: more processes are slower.
- compute: a 0.8 M-parameter MLP, global batch 2048 (per rank 1024 at N = 2): forward and
           backward take many times as long as the all-reduce of its 3 MB of gradients, so 2
           processes approach 2x on 2 free cores.

For DDP it also splits a step: t_compute (the same step under no_sync(): no communication),
t_comm (all-reducing the gradients alone, in DDP-like buckets) and t_step (the DDP step);
overlap = (t_compute + t_comm - t_step) / t_comm: 1 = communication entirely hidden behind
backward, 0 = not at all, below 0 = the two slow each other down (they share the CPU cores).
Times are medians over --steps steps (after --warmup), each the slowest rank's.
"""
import argparse
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

MODELS = {  # name: (layer widths, default global batch, loss)
    "small": ([32, 128, 128, 1], 64, "mse"),
    "compute": ([256, 768, 768, 10], 2048, "cross_entropy"),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "both"], default="both", help="default: both")
    parser.add_argument("--global-batch-size", type=int, help="samples per step, all processes together "
                        "(default: 64 for small, 2048 for compute)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process (default 1)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size (default 25)")
    parser.add_argument("--nproc-list", help="plain python only: also run DDP with these process counts, e.g. 1,2")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per torchrun job (default 300)")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="print a summary line, not the table")
    args = parser.parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--steps and --threads must be at least 1, --warmup at least 0")
    if not args.bucket_cap_mb > 0 or not args.timeout > 0:
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
    for a, b in zip(widths[:-1], widths[1:]):
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


def single_process(name, batch, steps, warmup, device, data_parallel=False):
    """One process, the whole global batch (DataParallel: split over all GPUs by one process).
    Returns the step times in seconds."""
    model = make_model(name, device)
    if data_parallel:
        model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = make_batch(name, batch, device, seed=0)
    times = [timed(lambda: train_step(model, optimizer, x, y, MODELS[name][2]), device)
             for _ in range(warmup + steps)][warmup:]
    return times


def gradient_buckets(model, cap_mb, device):
    """Flat tensors sized like DDP's buckets: reverse parameter order, first bucket 1 MB, then cap_mb."""
    sizes, current, cap = [], 0, 2**20
    for p in reversed(list(model.parameters())):
        nbytes = p.numel() * p.element_size()
        if current and current + nbytes > cap:
            sizes.append(current)
            current, cap = 0, cap_mb * 2**20
        current += nbytes
    sizes.append(current)
    return [torch.zeros(s // 4, device=device) for s in sizes]


def ddp_run(name, batch, args, device):
    """DDP at the current world size: t_step, t_compute (no_sync), t_comm (all-reduce alone)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_model(name, device)
    ddp_model = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    x, y = make_batch(name, batch // world_size, device, seed=1 + rank)
    loss_name = MODELS[name][2]
    buckets = gradient_buckets(model, args.bucket_cap_mb, device)

    def step():
        train_step(ddp_model, optimizer, x, y, loss_name)

    def compute_only():
        with ddp_model.no_sync():
            train_step(ddp_model, optimizer, x, y, loss_name)

    def comm_only():
        for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
            work.wait()

    variants = {"step": step, "compute": compute_only, "comm": comm_only}
    times = {k: [] for k in variants}
    for i in range(args.warmup + args.steps):
        for key, fn in variants.items():  # alternate: the three see the same machine load
            dist.barrier()
            t = timed(fn, device)
            if i >= args.warmup:
                times[key].append(t)
    table = torch.tensor([times[k] for k in variants], dtype=torch.float64, device=device)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)  # each step lasts until the slowest rank is done
    t_step, t_compute, t_comm = (statistics.median(row) for row in table.cpu().tolist())
    return {"step_s": t_step, "compute_s": t_compute, "comm_s": t_comm,
            "overlap": (t_compute + t_comm - t_step) / t_comm if world_size > 1 else None,
            "gradient_bytes": sum(b.numel() * 4 for b in buckets), "buckets": len(buckets)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def setup(device_hint=None):
    """Backend and device from what is present; works under torchrun and as plain python."""
    for key, value in [("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")]:
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = free_port()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=30))
    return backend, device


def launch(n, args, out):
    """DDP with n processes: this script under torchrun, killed with its workers after --timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__,
           "--model", args.model, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads), "--bucket-cap-mb", str(args.bucket_cap_mb), "--json", str(out), "--quiet"]
    if args.global_batch_size:
        cmd += ["--global-batch-size", str(args.global_batch_size)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"bench_scaling: DDP with {n} processes did not finish within {args.timeout:g} s")
    if proc.returncode != 0:
        raise SystemExit(f"bench_scaling: DDP with {n} processes failed:\n" + err[-2000:])
    return json.loads(out.read_text())


def table(report):
    lines = []
    for name, m in report["models"].items():
        lines.append(f"# model={name}: {m['parameters']} parameters ({m['gradient_bytes'] / 2**20:.2f} MB of "
                     f"gradients), global batch {m['global_batch']}, {report['backend']} on {report['device']}")
        lines.append(f"#{'configuration':<14} {'procs':>5} {'step(ms)':>9} {'samples/s':>10} {'speedup':>8} "
                     f"{'effic.':>7} {'compute(ms)':>12} {'comm(ms)':>9} {'overlap':>8}")
        base = m["one_process"]["samples_per_s"] if "one_process" in m else None
        rows = [("one process", 1, m["one_process"])] if base else []
        rows += [("DataParallel", report["gpus"], m["data_parallel"])] if "step_s" in m.get("data_parallel", {}) else []
        rows += [("DDP", int(n), r) for n, r in m["ddp"].items()]
        for label, n, r in rows:
            extra = ""
            if r.get("overlap") is not None:
                extra = f" {1e3 * r['compute_s']:>12.2f} {1e3 * r['comm_s']:>9.2f} {r['overlap']:>8.2f}"
            ratios = f"{r['samples_per_s'] / base:>8.2f} {r['samples_per_s'] / base / n:>7.0%}" if base else f"{'-':>8} {'-':>7}"
            lines.append(f" {label:<14} {n:>5} {1e3 * r['step_s']:>9.2f} {r['samples_per_s']:>10.0f} {ratios}{extra}")
        if "skipped" in m.get("data_parallel", {}):
            lines.append(f" DataParallel skipped: {m['data_parallel']['skipped']}")
    return lines


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    launched = "RANK" in os.environ  # under torchrun: DDP at this world size only
    backend, device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    children = [n for n in args.nprocs if n > 1] if not launched else []
    # With torchrun jobs to come, half the baseline steps run now and half after them (A-B-A):
    # a machine that gets busier or quieter meanwhile then biases neither side.
    first_half = (args.steps + 1) // 2 if children else args.steps
    report = {"backend": backend, "device": device.type, "gpus": gpus, "cpu_cores": os.cpu_count(),
              "threads_per_process": args.threads if device.type == "cpu" else None,
              "steps": args.steps, "warmup": args.warmup,
              "statistic": "median over steps of the slowest rank's time", "models": {}}
    for name in args.models:
        batch = args.global_batch_size or MODELS[name][1]
        model = make_model(name, device)
        m = {"global_batch": batch, "parameters": sum(p.numel() for p in model.parameters()),
             "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()), "ddp": {}}
        if not launched:  # plain python: the single-process baselines
            m["one_process"] = {"times": single_process(name, batch, first_half, args.warmup, device)}
            if gpus >= 2:
                m["data_parallel"] = {"times": single_process(name, batch, args.steps, args.warmup, device,
                                                              data_parallel=True)}
            else:
                m["data_parallel"] = {"skipped": "DataParallel needs 2+ GPUs; without them it runs the "
                                      "module once on the whole batch (device_ids is empty), nothing in parallel"}
        if world_size in args.nprocs or launched:
            m["ddp"][str(world_size)] = ddp_run(name, batch, args, device)
        report["models"][name] = m
    gc.collect()  # ddp_run's DDP objects are gone: the group is released here, not at exit,
    dist.destroy_process_group()  # where gloo's threads torn down during shutdown can abort the process

    if not launched:
        with tempfile.TemporaryDirectory() as tmp:
            for n in children:
                if device.type == "cuda" and n > gpus:
                    sys.stdout.write(f"# DDP with {n} processes skipped: only {gpus} GPU(s)\n")
                    continue
                child = launch(n, args, Path(tmp) / f"n{n}.json")
                for name in args.models:
                    report["models"][name]["ddp"][str(n)] = child["models"][name]["ddp"][str(n)]
        for name, m in report["models"].items():
            if children:
                m["one_process"]["times"] += single_process(name, m["global_batch"], args.steps - first_half,
                                                            args.warmup, device)
            for r in (m["one_process"], m["data_parallel"]):
                if "times" in r:
                    r["step_s"] = statistics.median(r["times"])
            base = m["global_batch"] / m["one_process"]["step_s"]
            for n, r in [("1", m["one_process"]), (str(gpus), m["data_parallel"]), *m["ddp"].items()]:
                if "step_s" in r:
                    r["samples_per_s"] = m["global_batch"] / r["step_s"]
                    r["speedup"] = r["samples_per_s"] / base
                    r["efficiency"] = r["speedup"] / int(n)
    else:
        for m in report["models"].values():
            for r in m["ddp"].values():
                r["samples_per_s"] = m["global_batch"] / r["step_s"]

    if rank == 0:
        lines = []
        if device.type == "cpu":
            lines.append(f"# CPU: {args.threads} thread(s) per process (--threads), so N processes use N of "
                         f"the {os.cpu_count()} cores; more processes than free cores is not a fair comparison")
        lines += table(report)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")
            lines.append(f"# wrote {args.json}")
        if args.quiet:
            ns = sorted({int(n) for m in report["models"].values() for n in m["ddp"]})
            parts = [f"bench_scaling {', '.join(args.models)}: backend={backend} device={device.type}"]
            if device.type == "cpu":
                parts.append(f"{args.threads} thread(s) per process")
            parts.append("measured " + ("one process, " if not launched else "")
                         + f"DDP on {' and '.join(map(str, ns))} process(es)")
            if not launched and gpus < 2:
                parts.append("DataParallel skipped (needs 2+ GPUs)")
            if args.json:
                parts.append(f"wrote {args.json}")
            lines = ["; ".join(parts)]
        sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
