"""Chapter 17b: torch.compile under FSDP2 and tensor parallelism, per block, counted.

    torchrun --standalone --nproc_per_node=2 c17b_compile_sharded.py --part layouts --out work/compile
    torchrun --standalone --nproc_per_node=2 c17b_compile_sharded.py --part compiler --out work/compile
    torchrun --standalone --nproc_per_node=2 c17b_compile_sharded.py --part autograd --out work/compile

--part layouts: for each layout (--layouts: fsdp, FSDP2 over every rank, each block a unit; tp,
every block's linears split over every rank with parallelize_module), chapter 11's GPT trains
--steps steps eagerly, then again with every block compiled after sharding (parallel_course.
compiled.compile_blocks, --backend aot_eager by default): the graphs, recompiles and graph breaks,
each step's collectives by name (parallel_course.compiled.Collectives, which sees what compiled
code runs), each step's time and the losses. --part compiler, under FSDP2: the eager run again,
blocks with a finiteness check in their forward (a graph break), batches whose length changes (a
recompile), and a compiled step under CommDebugMode (which makes torch.compile stand aside).
--part autograd: compiled autograd on a small model, alone and under FSDP2. Rank 0 prints what it
counted and
writes it to OUT/PART.json. The process group comes from dist_setup.py, beside this file.
"""

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from dist_setup import setup, teardown
from parallel_course import compiled, float8
from parallel_course.gpt import AdditionTask, Block, GPTConfig, answer_loss_sum

LAYOUTS = ("fsdp", "tp")
GLOBAL_BATCH = 64


def print0(text: str) -> None:
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def shard(model: nn.Module, layout: str, mesh) -> None:
    """FSDP2 as train_gpt.py applies it, or Megatron-style tensor parallelism in every block."""
    if layout == "fsdp":
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel()}
    plan.update({"attn.proj": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
    for block in model.blocks:
        parallelize_module(block, mesh, plan)


class CheckedBlock(Block):
    """A block that refuses non-finite activations: a Python branch on a tensor's value, which
    dynamo cannot put in a graph (a graph break before and after it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.isfinite(x).all():
            raise FloatingPointError("non-finite activations")
        return super().forward(x)


def train(layout: str, mesh, device, steps: int, backend=None, checked=False, digits=(2,)) -> dict:
    """Train from the same weights on the same batches, every step's collectives and time recorded.
    ``backend``: compile every block after sharding; ``checked``: blocks with a finiteness check;
    ``digits``: the problems' digits, step by step (their sequences' length changes with them)."""
    compiled.reset()
    model = float8.capstone().to(device)
    if checked:
        for block in model.blocks:
            block.__class__ = CheckedBlock
    shard(model, layout, mesh)
    counter = compiled.CompileCounter(backend) if backend else None
    if counter:
        compiled.compile_blocks(model, counter)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    # FSDP: each rank its rows of the batch; TP: every rank the whole batch.
    parts, index = (dist.get_world_size(), dist.get_rank()) if layout == "fsdp" else (1, 0)
    losses, collectives, times = [], [], []
    for step in range(steps):
        task = AdditionTask(digits[min(step, len(digits) - 1)])
        x, y = task.batch(generator, GLOBAL_BATCH)
        share = GLOBAL_BATCH // parts
        x, y = x[index * share : (index + 1) * share].to(device), y[index * share : (index + 1) * share].to(device)
        start = time.perf_counter()
        with compiled.Collectives() as seen:
            loss_sum, count = answer_loss_sum(model(x), y)
            optimizer.zero_grad()
            (loss_sum / count).backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
        collectives.append(dict(seen.counts))
        total = loss_sum.detach()
        if parts > 1:
            dist.all_reduce(total)
        losses.append(total.item() / (count * parts))
    result = {"losses": losses, "collectives": collectives, "times": times}
    if counter:
        result.update(
            graphs=counter.graphs, recompiles=counter.recompiles, graph_breaks=compiled.graph_breaks(), ids=counter.ids
        )
    return result


def under_comm_debug_mode(mesh, device, backend) -> dict:
    """One compiled FSDP2 step under CommDebugMode: how many graphs it compiled, what it counted."""
    compiled.reset()
    model = float8.capstone().to(device)
    shard(model, "fsdp", mesh)
    counter = compiled.CompileCounter(backend)
    compiled.compile_blocks(model, counter)
    share = GLOBAL_BATCH // dist.get_world_size()
    x, y = (t[:share].to(device) for t in AdditionTask(2).batch(torch.Generator().manual_seed(1), GLOBAL_BATCH))
    # CommDebugMode tracks modules with global hooks, which warn when the batch needs no gradient.
    with CommDebugMode() as mode, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss_sum, count = answer_loss_sum(model(x), y)
        (loss_sum / count).backward()
    counts = {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}
    return {"graphs": counter.graphs, "counts": counts}


def compiled_autograd(mesh, device, backend, sharded: bool) -> dict:
    """Backward of a small MLP (two FSDP2 units when ``sharded``) eagerly, then under compiled autograd:
    the graphs, the collectives, and the gradients (each rank's share) of both."""
    results = {}
    for mode in ("eager", "compiled autograd"):
        compiled.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
        if sharded:
            for layer in (model[0], model[2], model):
                fully_shard(layer, mesh=mesh)
        counter = compiled.CompileCounter(backend)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank())).to(device)
        with compiled.Collectives() as seen:
            loss = model(x).square().mean()
            if mode == "eager":
                loss.backward()
            else:
                with compiled.compiled_autograd(counter):
                    loss.backward()
        grads = [p.grad for p in model.parameters()]
        results[mode] = {
            "backward_graphs": counter.backward_graphs,
            "collectives": dict(seen.counts),
            "sharded_gradients": sum(isinstance(g, DTensor) for g in grads),
            "gradients": [(g.to_local() if isinstance(g, DTensor) else g).detach().cpu() for g in grads],
        }
    eager, traced = results["eager"]["gradients"], results["compiled autograd"]["gradients"]
    same = all(a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(eager, traced))
    for r in results.values():
        r["gradients"] = len(r["gradients"])
    return {**results, "same_gradients": same}


def layouts(args, mesh, device) -> dict:
    """Each layout eagerly, then with every block compiled."""
    runs = {}
    for layout in args.layouts:
        runs[f"{layout}, eager"] = train(layout, mesh, device, args.steps)
        runs[f"{layout}, compiled"] = train(layout, mesh, device, args.steps, args.backend)
    return {"runs": runs}


def compiler(args, mesh, device) -> dict:
    """What makes the compiler work, under FSDP2: a graph break, a recompile, and CommDebugMode."""
    runs = {
        "fsdp, eager": train("fsdp", mesh, device, args.steps),
        "fsdp, checked blocks": train("fsdp", mesh, device, args.steps, args.backend, checked=True),
        "fsdp, 2-4 digits": train("fsdp", mesh, device, 4, args.backend, digits=(2, 3, 4, 4)),
    }
    return {"runs": runs, "comm_debug_mode": under_comm_debug_mode(mesh, device, args.backend)}


def autograd(args, mesh, device) -> dict:
    """Compiled autograd on a small model, alone and under FSDP2."""
    return {
        "compiled_autograd": {
            "one process": compiled_autograd(mesh, device, args.backend, sharded=False),
            "fsdp": compiled_autograd(mesh, device, args.backend, sharded=True),
        }
    }


def print_report(report: dict) -> None:
    print0(f"{report['world_size']} ranks, compiled with {report['backend']}")
    if "runs" in report:
        print0(f"{'run':22} {'graphs':>6} {'breaks':>6} {'recompiles':>10}  collectives in the last step")
    for name, r in report.get("runs", {}).items():
        counts = ", ".join(f"{n} {op}" for op, n in sorted(r["collectives"][-1].items())) or "none"
        if "graphs" in r:
            breaks = sum(r["graph_breaks"].values())
            print0(f"{name:22} {r['graphs']:>6} {breaks:>6} {r['recompiles']:>10}  {counts}")
        else:
            print0(f"{name:22} {'-':>6} {'-':>6} {'-':>10}  {counts}")
    if "comm_debug_mode" in report:
        for reason in report["runs"]["fsdp, checked blocks"]["graph_breaks"]:
            print0(f"checked blocks, the graph break: {reason}")
        debug = report["comm_debug_mode"]
        print0(f"a compiled step under CommDebugMode: {debug['graphs']} graphs compiled; it counted {debug['counts']}")
    for where, r in report.get("compiled_autograd", {}).items():
        eager, traced = r["eager"], r["compiled autograd"]
        print0(
            f"compiled autograd, {where}: {traced['backward_graphs']} backward graphs; collectives "
            f"{traced['collectives'] or 'none'} (eager {eager['collectives'] or 'none'}); sharded gradients "
            f"{traced['sharded_gradients']} of {traced['gradients']} (eager {eager['sharded_gradients']}); "
            f"gradients equal eager's: {r['same_gradients']}"
        )


PARTS = {"layouts": layouts, "compiler": compiler, "autograd": autograd}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", choices=PARTS, required=True, help="layouts; compiler (what makes it work); autograd (compiled)"
    )
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS), help="default: fsdp tp")
    parser.add_argument("--backend", default="aot_eager", choices=["aot_eager", "inductor"], help="default aot_eager")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of each run (default 4)")
    parser.add_argument("--out", type=Path, required=True, help="folder for PART.json")
    args = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    heads = GPTConfig().n_heads
    if args.part == "layouts" and "tp" in args.layouts and heads % world_size:
        parser.error(f"tp splits the {heads} attention heads over the processes: use 1, 2 or 4, not {world_size}")
    if GLOBAL_BATCH % world_size:
        parser.error(f"the global batch of {GLOBAL_BATCH} problems does not split over {world_size} processes")
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    device = setup()
    # FSDP2 warns that the root's logits are a view; nothing changes them in place here.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    report = {"world_size": dist.get_world_size(), "backend": args.backend, "steps": args.steps}
    report.update(PARTS[args.part](args, mesh, device))
    print_report(report)
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.part}.json").write_text(json.dumps(report, indent=1))
        print0(f"wrote {args.out / args.part}.json")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
