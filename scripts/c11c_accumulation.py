"""Chapter 11c: gradient accumulation with token counts that vary, in every layout, in one launch.

    torchrun --standalone --nproc_per_node=4 c11c_accumulation.py --layouts ddp fsdp --out work/accumulation.json

Trains with train_gpt.py's own functions (beside this file, with dist_setup.py) each layout asked
for (ddp, fsdp, tp, 2d) on 4 processes with 1, 2 and 4 micro-batches per step, on problems of
mixed lengths; then fsdp with 4 micro-batches reducing after every one. One process group serves
every run: one launch, not one per run; the runs of one shape share its device mesh. Rank 0 writes
each run's losses and gradient norms, the gradient bytes a rank held between micro-batches and the
reduce-scatters FSDP sent per step (counted by parallel_course.communication.CollectiveCounter), as
JSON.
"""

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import train_gpt
from dist_setup import setup, teardown
from parallel_course.communication import CollectiveCounter

LAYOUTS = ("ddp", "fsdp", "tp", "2d")
MICRO_BATCHES = (1, 2, 4)


def run(layout: str, options: list[str], device) -> dict:
    """One training of train_gpt.py, in this process group: its losses, its gradient norms and what it
    held and sent."""
    args = train_gpt.parse_args(["--parallel", layout, *options, "--out", "unused"])
    meshes, model, wrapper = train_gpt.prepare(args, device)
    # train() logs every step; the runs' logs would drown the table the notebook prints.
    with CollectiveCounter() as sent, contextlib.redirect_stdout(io.StringIO()):
        trained = train_gpt.train(args, model, wrapper, meshes, device)
    memory = trained["memory"]
    return {
        "layout": layout,
        "micro_batches": args.grad_accum,
        "sync_every_micro_batch": args.sync_every_micro_batch,
        "losses": trained["losses"],
        "gradient_norms": trained["gradient_norms"],
        "parameter_bytes": memory["parameter_bytes"],
        "gradient_bytes": memory["gradient_bytes"],
        "gradient_bytes_between_micro_batches": memory["gradient_bytes_between_micro_batches"],
        "reduce_scatters_per_step": sum(c.op == "reduce_scatter_single" for c in sent.calls) // args.steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="Gradient accumulation in every layout, in one launch.")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True, help="the JSON file rank 0 writes")
    args = parser.parse_args()
    # Checked before the group is joined: one line, before anything starts.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != 4:
        parser.error(f"runs on 4 processes (2d is 2 x 2), got {world_size}")
    device = setup()
    common = ["--steps", str(args.steps), "--seed", str(args.seed)]
    common += ["--global-batch-size", str(args.global_batch_size), "--variable-length"]
    runs = [run(layout, [*common, "--grad-accum", str(k)], device) for layout in args.layouts for k in MICRO_BATCHES]
    if "fsdp" in args.layouts:
        runs.append(run("fsdp", [*common, "--grad-accum", "4", "--sync-every-micro-batch"], device))
    if dist.get_rank() == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(runs, indent=1) + "\n")
        sys.stdout.write(f"{len(runs)} trainings on {dist.get_world_size()} processes; wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
