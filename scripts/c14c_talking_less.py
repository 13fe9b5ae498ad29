"""Chapter 14c: data parallelism that talks less, counted while it trains.

    torchrun --standalone --nproc_per_node=2 c14c_talking_less.py --mode hooks local-sgd --out work/talking_less
    torchrun --standalone --nproc_per_node=4 c14c_talking_less.py --mode hsdp --out work/talking_less

--mode hooks: DDP with its default all-reduce, with fp16_compress_hook and with PowerSGD, from the
same weights on the same data; bf16_compress_hook tried. --mode hsdp (4 processes): FSDP2 on a
(replicate 2, shard 2) mesh and on all 4 ranks, against one process training on the whole batch,
and two negative controls: HSDP with its data split by the shard coordinate only, and HSDP whose
gradients are divided by the shard group's size only, not the world's. --mode
local-sgd: gradients averaged every step, then local SGD / DiLoCo syncing every H steps.
Every collective each step calls is recorded (parallel_course.communication.CollectiveCounter);
each step's gradient norm too (parallel_course.training.gradient_norm, its collectives not counted);
rank 0 prints a summary of each mode and writes its losses, gradient norms and counts (for hsdp,
every rank's collectives of the last step) to OUT/MODE.json for the notebook to check. Several modes in one
launch share its start-up (most of a small launch's time).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_setup import setup, teardown
from parallel_course.communication import CollectiveCounter, OuterStep, totals
from parallel_course.training.gradient_norm import gradient_norm

MODES = ("hooks", "hsdp", "local-sgd")


def mlp(sizes, seed, device):
    """Linear layers with ReLU between them, the same weights on every rank."""
    torch.manual_seed(seed)
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(device)


def global_batch(step, size, sizes, device):
    """Step `step`'s whole batch, the same on every rank: inputs and a fixed random teacher's
    outputs (the teacher never changes, the noise and inputs do)."""
    teacher = mlp(sizes, seed=1234, device=device)
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(size, sizes[0], generator=g).to(device)
    with torch.no_grad():
        y = 4 * teacher(x) + 0.1 * torch.randn(size, sizes[-1], generator=g).to(device)
    return x, y


def share(t, index, parts):
    """Rows index*B/parts to (index+1)*B/parts: one rank's share of a global batch."""
    n = t.shape[0] // parts
    return t[index * n : (index + 1) * n]


def gathered_losses(losses, device):
    """Every rank's per-step losses, rank order (one all-gather, after the counting)."""
    mine = torch.tensor(losses, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return torch.stack(every).cpu()


def per_step(calls_by_step):
    return [totals(calls) for calls in calls_by_step]


def train_counted(model, optimizer, args, sizes, device, index, parts):
    """args.steps steps, each on share ``index`` of ``parts`` of a global batch of args.batch rows per
    rank, every collective counted: (this rank's losses, the calls of each step, the whole gradient's
    norm in each step, the same on every rank)."""
    losses, calls, norms = [], [], []
    with CollectiveCounter() as counter:
        for step in range(args.steps):
            x, y = global_batch(step, args.batch * dist.get_world_size(), sizes, device)
            loss = F.mse_loss(model(share(x, index, parts)), share(y, index, parts))
            optimizer.zero_grad()
            # DDP waits for every bucket's future (and its callbacks) before backward() returns.
            loss.backward()
            calls.append(counter.clear())
            # The norm's own collectives are the check's, not the training's: left out of the count.
            norms.append(gradient_norm(model).item())
            counter.clear()
            optimizer.step()
            losses.append(loss.item())
    return losses, calls, norms


# --mode hooks


def train_ddp(hook_name, args, device, rank, world_size):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    sizes = (64, 128, 128, 10)
    model = DDP(mlp(sizes, seed=args.seed, device=device))
    if hook_name == "allreduce":
        # DDP's default, registered explicitly so that it goes through dist.all_reduce and is
        # counted (without a hook, DDP's C++ reducer calls the process group directly).
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook_name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.rank, start_powerSGD_iter=args.start_iter
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, calls, _ = train_counted(model, optimizer, args, sizes, device, rank, world_size)
    shapes = [list(p.shape) for p in model.module.parameters()]
    return gathered_losses(losses, device).mean(0).tolist(), per_step(calls), shapes


def bf16_refusal(device):
    """Try bf16_compress_hook for one step; the refusal's first line, or None when it ran."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp((4, 4), seed=0, device=device))
    try:
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        model(torch.ones(2, 4, device=device)).sum().backward()
    except TypeError as error:
        return f"TypeError: {str(error).splitlines()[0]}"
    return None


def hooks(args, device, rank, world_size):
    runs = {}
    for name in ("allreduce", "fp16", "powersgd"):
        losses, steps, shapes = train_ddp(name, args, device, rank, world_size)
        runs[name] = {"losses": losses, "per_step": steps}
    refusal = bf16_refusal(device)
    # 16-bit tensors themselves all-reduce on gloo: it is the hook that refuses.
    sums = []
    for dtype in (torch.float16, torch.bfloat16):
        t = torch.full((3,), 1.5, dtype=dtype, device=device)
        dist.all_reduce(t)
        sums.append(f"{dtype}: {t[0].item()}")
    if rank == 0:
        print(f"DDP, {world_size} ranks, {args.steps} steps, PowerSGD rank {args.rank} from step {args.start_iter + 1}")
        print(f"{'hook':<10} {'all-reduces at step 1 / last':>28} {'bytes at step 1 / last':>24} {'final loss':>11}")
        for name, run in runs.items():
            first, last = run["per_step"][0], run["per_step"][-1]
            calls = f"{first['calls']} / {last['calls']}"
            sent = f"{first['payload_bytes']:,} / {last['payload_bytes']:,}"
            print(f"{name:<10} {calls:>28} {sent:>24} {run['losses'][-1]:>11.4f}")
        print(f"bf16_compress_hook: {refusal or 'ran'}")
        print(f"all_reduce of 16-bit tensors holding 1.5 on {world_size} ranks: {'; '.join(sums)}")
        return {"shapes": shapes, "runs": runs, "bf16": refusal, "world_size": world_size, **vars_of(args)}
    return None


# --mode hsdp


def train_sharded(layout, args, device, rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    sizes = (32, 64, 64, 8)
    model = mlp(sizes, seed=args.seed, device=device)
    if layout == "single":
        data_index, data_parts = 0, 1
    else:
        if layout == "fsdp":
            mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
        else:
            mesh = init_device_mesh(device.type, (2, world_size // 2), mesh_dim_names=("replicate", "shard"))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if layout == "hsdp, gradients / shard size":
            # The negative control of the gradient's scale: divided by the 2 ranks of a shard group,
            # as if the replicas were not averaging too; each gradient is then twice the average.
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_gradient_divide_factor(float(mesh["shard"].size()))
        # Each rank its own share of the batch: its global rank picks it. The negative control
        # picks it by the rank's coordinate on the shard dimension: both replicas take the same
        # rows, and half the batch is never used.
        data_index = mesh["shard"].get_local_rank() if layout == "hsdp, data by shard rank" else rank
        data_parts = world_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, calls, norms = train_counted(model, optimizer, args, sizes, device, data_index, data_parts)
    if layout == "single":
        return {"losses": losses, "gradient_norms": norms}
    parameters = [p for p in model.parameters()]
    # Every rank's collectives of the last step, to rank 0 (after the counting): which ring edges
    # carry them, and so which bytes cross between nodes, depends on every rank's sends.
    last_step = [
        {"op": c.op, "group_size": c.group_size, "ranks": list(c.ranks), "payload_bytes": c.payload_bytes}
        for c in calls[-1]
    ]
    calls_by_rank = [None] * world_size
    dist.all_gather_object(calls_by_rank, last_step)
    result = {
        "losses": gathered_losses(losses, device).mean(0).tolist(),
        "gradient_norms": norms,
        "group_elements": [
            sum(p.numel() for p in layer.parameters()) for layer in model if isinstance(layer, nn.Linear)
        ],
        "local_elements": sum(p.to_local().numel() for p in parameters),
        "placements": str(parameters[0].placements),
        "calls_by_rank": calls_by_rank,
    }
    return result


def hsdp(args, device, rank, world_size):
    runs = {}
    for layout in ("single", "hsdp", "fsdp", "hsdp, data by shard rank", "hsdp, gradients / shard size"):
        runs[layout] = train_sharded(layout, args, device, rank, world_size)
    if rank == 0:
        print(f"{world_size} ranks, {args.steps} AdamW steps, global batch {args.batch * world_size}")
        for layout, run in runs.items():
            stored = f"{run['local_elements']:,} elements on rank 0" if "local_elements" in run else "everything"
            losses = " ".join(f"{x:.4f}" for x in run["losses"])
            print(f"{layout:<30} stores {stored:<24} losses {losses}")
        print(f"HSDP placements: {runs['hsdp']['placements']}")
        return {"runs": runs, "world_size": world_size, **vars_of(args)}
    return None


# --mode local-sgd


def train_local(h, inner, outer, args, device, rank, world_size):
    """h = 0: gradients averaged every step (synchronous data parallelism, by hand); else inner
    steps on this rank's data and the outer step every h steps."""
    sizes = (16, 32, 32, 1)
    model = mlp(sizes, seed=args.seed, device=device)
    if inner == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    outer_step = OuterStep(model, **outer) if h else None
    losses, calls = [], []
    with CollectiveCounter() as counter:
        for step in range(args.steps):
            x, y = global_batch(step, args.batch * world_size, sizes, device)
            loss = F.mse_loss(model(share(x, rank, world_size)), share(y, rank, world_size))
            optimizer.zero_grad()
            loss.backward()
            if not h:
                flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                dist.all_reduce(flat, op=dist.ReduceOp.AVG)
                torch.nn.utils.vector_to_parameters(flat, [p.grad for p in model.parameters()])
            optimizer.step()
            if h and (step + 1) % h == 0:
                outer_step.step()
            losses.append(loss.item())
            calls.append(counter.clear())
    # A held-out batch, on the synchronised weights (the same on every rank after the last sync).
    x, y = global_batch(-1, 256, sizes, device)
    with torch.no_grad():
        held_out = F.mse_loss(model(x), y).item()
    weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()
    every = totals(c for step_calls in calls for c in step_calls)
    return {
        "losses": gathered_losses(losses, device).mean(0).tolist(),
        "held_out": held_out,
        "all_reduces": every["calls"],
        "payload_bytes": every["payload_bytes"],
        "weights": weights.tolist(),
        "elements": weights.numel(),
    }


def local_sgd(args, device, rank, world_size):
    nesterov = {"lr": args.outer_lr, "momentum": args.outer_momentum, "nesterov": True}
    plain = {"lr": 1.0, "momentum": 0.0, "nesterov": False}
    runs = {"sync, AdamW": train_local(0, "adamw", None, args, device, rank, world_size)}
    for h in args.h:
        runs[f"DiLoCo H={h}"] = train_local(h, "adamw", nesterov, args, device, rank, world_size)
    # H = 1, inner SGD, outer SGD of learning rate 1 without momentum: the weights averaged after
    # every SGD step, which is the SGD step on the averaged gradient.
    runs["sync, SGD"] = train_local(0, "sgd", None, args, device, rank, world_size)
    runs["local SGD H=1, outer lr 1"] = train_local(1, "sgd", plain, args, device, rank, world_size)
    if rank == 0:
        print(
            f"{world_size} ranks, {args.steps} inner steps, "
            f"outer Nesterov lr {args.outer_lr} momentum {args.outer_momentum}"
        )
        print(f"{'run':<26} {'all-reduces':>11} {'bytes per step':>15} {'last loss':>10} {'held-out':>9}")
        for name, run in runs.items():
            per_step = run["payload_bytes"] / args.steps
            row = f"{name:<26} {run['all_reduces']:>11} {per_step:>15,.0f}"
            print(f"{row} {run['losses'][-1]:>10.4f} {run['held_out']:>9.4f}")
        return {"runs": runs, "world_size": world_size, **vars_of(args)}
    return None


def vars_of(args):
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


DEFAULTS = {"hooks": (24, 0.05, 16), "hsdp": (4, 0.01, 16), "local-sgd": (64, 0.01, 64)}


def settings(args, mode):
    """args with the mode's defaults for what was not given: steps, learning rate, batch."""
    steps, lr, batch = DEFAULTS[mode]
    given = vars(args)
    return argparse.Namespace(
        **{**given, "mode": mode, "steps": args.steps or steps, "lr": args.lr or lr, "batch": args.batch or batch}
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="Compressed gradients, HSDP and local SGD, counted while training.")
    parser.add_argument("--mode", choices=MODES, nargs="+", required=True, help="one or more, run in this order")
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps (default: 24 hooks, 4 hsdp, 64 local-sgd)"
    )
    parser.add_argument("--batch", type=int, default=None, help="rows per rank per step (default: 16; 64 local-sgd)")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="(inner) learning rate (default: 0.05 hooks, SGD; 0.01 hsdp, local-sgd, AdamW)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=2, help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--start-iter", type=int, default=4, help="PowerSGD's start_powerSGD_iter (> 1)")
    parser.add_argument("--h", type=int, nargs="+", default=[1, 4, 16], help="local-sgd: steps between syncs")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--out", type=Path, required=True, help="the directory rank 0 writes MODE.json into")
    args = parser.parse_args()
    # Checked before the group is joined: a bad request is one line, before anything starts.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if "hsdp" in args.mode and world_size != 4:
        parser.error("--mode hsdp runs on 4 processes (torchrun --nproc_per_node=4): a 2 x 2 mesh")
    if any(x is not None and x < 1 for x in (args.steps, args.batch)) or args.rank < 1:
        parser.error("--steps, --batch and --rank must be at least 1")
    if args.lr is not None and args.lr <= 0:
        parser.error("--lr must be positive")
    if args.start_iter < 2:
        parser.error("--start-iter must be at least 2 (PowerSGD's error feedback and warm start need it)")
    steps = settings(args, "local-sgd").steps
    if "local-sgd" in args.mode and any(h < 1 or steps % h for h in args.h):
        parser.error(f"every --h must be at least 1 and divide --steps ({steps})")
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    for mode in dict.fromkeys(args.mode):
        summary = {"hooks": hooks, "hsdp": hsdp, "local-sgd": local_sgd}[mode](
            settings(args, mode), device, rank, world_size
        )
        if rank == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{mode}.json").write_text(json.dumps(summary, indent=1) + "\n")
            sys.stdout.write(f"wrote {args.out / mode}.json\n")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
