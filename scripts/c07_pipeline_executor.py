"""A pipeline executor: one process per stage, activations and gradients sent with send/recv.

    torchrun --standalone --nproc_per_node=2 c07_pipeline_executor.py [--microbatches 4] [--repeats 3]
    torchrun --standalone --nproc_per_node=2 c07_pipeline_executor.py --orders orders.json

Each process holds one stage (a slice of the same 8-layer MLP) and follows its list of
operations, ("F", i) = forward of micro-batch i, ("B", i) = its backward, in order. It runs
naive model parallelism (the whole batch as one micro-batch), GPipe and 1F1B, whose orders come
from the course's package (parallel_course.model_parallel, where chapter 07a builds them), or the
orders in a JSON file: {"orders": [[["F", 0], ...], ...]}, one list per stage. It checks the
gradients against the unsplit model, and writes each stage's busy intervals to
DIR/c07_pipeline_executor.json.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_setup import setup, teardown
from parallel_course.model_parallel import gpipe_orders, one_f_one_b_orders

# Big enough that computing, not messaging, fills a stage's time.
WIDTH, LAYERS, BATCH = 1024, 8, 256
# A hung send or receive becomes an error, not a long wait (30 minutes by default on gloo).
TIMEOUT = timedelta(seconds=30)
# Gradients of a stage against the unsplit model's.
ATOL = 1e-5


def print0(text):
    """Print from rank 0 only, in one write (lines from several ranks never splice)."""
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def make_model(seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def my_stage(model, stage, n_stages):
    """This process's slice of the model: consecutive Linear+ReLU pairs, as evenly split as they go."""
    start, stop = (k * LAYERS // n_stages for k in (stage, stage + 1))
    return model[2 * start : 2 * stop]


def run_step(stage_model, order, x, y, m, device, groups):
    """Follow `order` for one training step; activations travel on groups["F"], gradients on groups["B"].

    Returns this stage's busy intervals (start, end, "F3"/"B3"/"L3" for the loss) and the most
    micro-batches whose activations it held at once.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    xs, ys = x.chunk(m), y.chunk(m)
    shape = (len(xs[0]), WIDTH)
    stash, sends, busy, peak = {}, [], [], 0

    def timed(label, fn, *args):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        busy.append((start, time.perf_counter(), label))
        return result

    for kind, i in order:
        if kind == "F":
            if first:
                inp = xs[i].to(device)
            else:
                # The previous stage's output.
                inp = torch.empty(shape, device=device)
                dist.recv(inp, src=rank - 1, group=groups["F"], tag=i)
                inp.requires_grad_()
            out = timed(f"F{i}", stage_model, inp)
            if last:
                # The last stage also computes the loss (label "L").
                out = timed(f"L{i}", lambda o, t: F.mse_loss(o, t) / m, out, ys[i].to(device))
            else:
                sends.append(dist.isend(out.detach(), dst=rank + 1, group=groups["F"], tag=i))
            # Kept until the backward of micro-batch i: the activations this stage holds.
            stash[i] = (inp, out)
            peak = max(peak, len(stash))
        else:
            inp, out = stash.pop(i)
            if last:
                timed(f"B{i}", out.backward)
            else:
                # d loss / d output, from the next stage.
                grad = torch.empty_like(out)
                dist.recv(grad, src=rank + 1, group=groups["B"], tag=i)
                timed(f"B{i}", out.backward, grad)
            if not first:
                sends.append(dist.isend(inp.grad, dst=rank - 1, group=groups["B"], tag=i))
    for request in sends:
        request.wait()
    return busy, peak


def span(stages):
    """Seconds from the first start to the last end of these stages' busy intervals."""
    intervals = [iv for busy in stages for iv in busy]
    return max(iv[1] for iv in intervals) - min(iv[0] for iv in intervals)


def overlap(stages):
    """Seconds during which two or more stages computed at the same time."""
    edges = sorted((t, d) for busy in stages for s, e, _ in busy for t, d in ((s, 1), (e, -1)))
    total, active, previous = 0.0, 0, None
    for t, d in edges:
        if active >= 2:
            total += t - previous
        active, previous = active + d, t
    return total


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per schedule (default 2)")
    parser.add_argument("--orders", help="JSON file with one list of operations per stage")
    parser.add_argument("--out", default="work", help="folder for c07_pipeline_executor.json (default: work)")
    args = parser.parse_args()
    if args.microbatches < 1 or args.repeats < 1 or BATCH % args.microbatches:
        parser.error(f"--microbatches must divide {BATCH} and --repeats be >= 1")
    # One stage per process, a layer at least each: refused before joining the group.
    stages = int(os.environ.get("WORLD_SIZE", "1"))
    if stages > LAYERS:
        parser.error(f"{LAYERS} layers make at most {LAYERS} stages, not {stages}")
    args.orders_given = None
    if args.orders:
        args.orders_given = json.loads(Path(args.orders).read_text())["orders"]
        if len(args.orders_given) != stages:
            parser.error(f"{args.orders} has orders for {len(args.orders_given)} stages, not {stages}")
    return args


def schedules_to_run(args, world_size):
    """{name: (micro-batches, orders)}: naive, GPipe and 1F1B (the orders parallel_course.model_parallel
    makes from each schedule's rule, chapter 07a's), or the orders given in a file."""
    if args.orders_given:
        orders = args.orders_given
        n = sum(1 for kind, _ in orders[0] if kind == "F")
        return {"given": (n, [[(str(k), int(i)) for k, i in order] for order in orders])}
    m = args.microbatches
    return {
        "naive": (1, gpipe_orders(world_size, 1)),
        "gpipe": (m, gpipe_orders(world_size, m)),
        "1f1b": (m, one_f_one_b_orders(world_size, m)),
    }


def measure(stage_model, orders, n_micro, x, y, device, groups, expected, steps, warmup):
    """Run `warmup` untimed steps, then `steps` timed ones. Returns, gathered from every stage, the
    busy intervals and peaks of the least disturbed step (the shortest), and the largest gradient
    difference from the unsplit model over all steps and stages."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    record = []
    for repeat in range(warmup + steps):
        stage_model.zero_grad()
        dist.barrier()
        busy, peak = run_step(stage_model, orders[rank], x, y, n_micro, device, groups)
        diff = max((p.grad.cpu() - e).abs().max().item() for p, e in zip(stage_model.parameters(), expected))
        everything = [None] * world_size
        dist.all_gather_object(everything, (busy, peak, diff))
        if repeat >= warmup:
            record.append(everything)
    worst = max(d for step in record for _, _, d in step)
    best = min(record, key=lambda step: span(s[0] for s in step))
    return [stage[0] for stage in best], [stage[1] for stage in best], worst


def main():
    args = parse_args()
    device = setup()
    if device.type == "cpu":
        # One core per stage.
        torch.set_num_threads(1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Activations and gradients travel on two process groups. Within one group, nccl runs the
    # sends and receives between two ranks in order on one stream, where a stage's send of an
    # activation and its receive of a gradient (1F1B interleaves them) could wait for each other.
    groups = {"F": dist.new_group(timeout=TIMEOUT), "B": dist.new_group(timeout=TIMEOUT)}
    schedules = schedules_to_run(args, world_size)

    torch.manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    # The unsplit reference, and this process's slice of a fresh copy of it.
    full = make_model()
    F.mse_loss(full(x), y).backward()
    expected = [p.grad for p in my_stage(full, rank, world_size).parameters()]
    stage_model = my_stage(make_model(), rank, world_size).to(device)

    sizes = sorted({len(my_stage(full, s, world_size)) // 2 for s in range(world_size)})
    print0(
        f"{world_size} stages, {' or '.join(map(str, sizes))} layers each, batch {BATCH}, "
        f"backend={dist.get_backend()} device={device.type}"
    )
    results = {}
    for index, (name, (n_micro, orders)) in enumerate(schedules.items()):
        # One untimed step before the first schedule.
        warmup = 1 if index == 0 else 0
        busy, peaks, worst = measure(stage_model, orders, n_micro, x, y, device, groups, expected, args.repeats, warmup)
        results[name] = {"microbatches": n_micro, "busy": busy, "peak_in_flight": peaks}
        # One micro-batch allows no overlap: "never" is the schedule's, checked. With more, the stages
        # can overlap, and do only where each has a core of its own while it computes: on a busy
        # machine none may be measured (tests/sanitize.cfg's pipeline-overlap).
        if overlap(busy) > 0:
            together = "yes"
        else:
            together = "never" if n_micro == 1 else "none measured"
        print0(
            f"{name:>5}: {n_micro} micro-batch(es), step {span(busy) * 1e3:.1f} ms, "
            f"two stages computing at the same time: {together}, most micro-batches held per stage: {peaks}"
        )
        print0(f"       gradients equal the unsplit model's: {worst <= ATOL} (max |difference| <= {ATOL:g})")
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "c07_pipeline_executor.json").write_text(json.dumps(results))
    # The verdict is the printed line, which a checker reads with the JSON after a clean exit.
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
