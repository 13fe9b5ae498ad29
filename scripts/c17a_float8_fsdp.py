"""Chapter 17a: FSDP2 with FP8 linears: what its all-gathers send, counted, and what it trains.

    torchrun --standalone --nproc_per_node=2 c17a_float8_fsdp.py --out work/fp8

Chapter 11's GPT under FSDP2 (each block a unit of its own, the rest in the root's), trained for
--steps steps (2 for the run that only counts) from the same weights on the same batches as one
process (parallel_course.float8.train), five ways: float32 parameters; bfloat16 all-gathers
(MixedPrecisionPolicy); FP8 linears (torchao's Float8Linear) gathered in float32; gathered in FP8
(enable_fsdp_float8_all_gather), each weight's amax all-reduced as it is cast; and the same with
the amaxes of every weight precomputed after the optimizer step, in one all-reduce. Every
collective is counted: the all-gathers with their bytes and dtypes (parallel_course.communication.
CollectiveCounter), all of them by name (parallel_course.compiled.Collectives, which sees torchao's
functional all-reduces). Then a unit whose weights are all FP8 is gathered once. Rank 0 prints a
table and writes the losses and counts to OUT/fsdp.json. The process group comes from
dist_setup.py, beside this file.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from dist_setup import setup, teardown
from parallel_course import float8
from parallel_course.communication import CollectiveCounter
from parallel_course.compiled import Collectives

GLOBAL_BATCH = 64
RUNS = {
    "float32": {"param_dtype": None, "float8": False, "fp8_gather": False, "precompute": False},
    "bfloat16 gathers": {"param_dtype": torch.bfloat16, "float8": False, "fp8_gather": False, "precompute": False},
    "float8, float32 gathers": {"param_dtype": None, "float8": True, "fp8_gather": False, "precompute": False},
    # Two steps: enough to count its all-reduces once the other run's are precomputed.
    "float8 gathers": {"param_dtype": None, "float8": True, "fp8_gather": True, "precompute": False, "steps": 2},
    "float8 gathers, precomputed": {"param_dtype": None, "float8": True, "fp8_gather": True, "precompute": True},
}


def print0(text: str) -> None:
    if dist.get_rank() == 0:
        sys.stdout.write(text + "\n")


def shard(model: nn.Module, mesh, param_dtype) -> None:
    """FSDP2 as chapter 11's train_gpt.py applies it: each block a unit, the rest in the root's."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def run(name: str, args, device, mesh) -> dict:
    """One way of training, every collective of every step counted."""
    options = RUNS[name]
    ao = float8.import_torchao()
    model = float8.capstone().to(device)
    converted = 0
    if options["float8"]:
        converted = float8.convert(
            model, emulate=float8.emulate_here(device), fsdp_float8_all_gather=options["fp8_gather"]
        )
    shard(model, mesh, options["param_dtype"])
    steps = []

    def after_step(model):
        if options["precompute"]:
            # Every FP8 weight's amax in one all-reduce, for the next step's casts (torchao's helper).
            ao.precompute_float8_dynamic_scale_for_fsdp(model)
        steps.append((counter.clear(), dict(seen.counts)))
        seen.counts.clear()

    with CollectiveCounter() as counter, Collectives() as seen:
        losses = float8.train(
            model,
            min(args.steps, options.get("steps", args.steps)),
            batch=GLOBAL_BATCH,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            after_step=after_step,
        )
    gathers = [[c for c in calls if c.op == "all_gather_single"] for calls, _ in steps]
    return {
        "converted": converted,
        "losses": losses,
        "all_gathers": [len(g) for g in gathers],
        "all_gather_bytes": [sum(c.payload_bytes for c in g) for g in gathers],
        "all_gather_dtypes": sorted({str(c.dtype).removeprefix("torch.") for g in gathers for c in g}),
        "collectives": [counts for _, counts in steps],
    }


def float8_alone(device, mesh) -> str:
    """Gather a unit whose inputs are all FP8 (a linear without bias, its weight in FP8) once: gloo
    carries no float8 tensors, and FSDP2 packs a unit's inputs into a uint8 buffer only when their
    dtypes differ."""
    float8.import_torchao()
    torch.manual_seed(0)
    unit = nn.Sequential(nn.Linear(16, 16, bias=False)).to(device)
    float8.convert(unit, emulate=float8.emulate_here(device), fsdp_float8_all_gather=True)
    fully_shard(unit, mesh=mesh)
    try:
        unit(torch.ones(2, 16, device=device)).sum().backward()
    except RuntimeError as error:
        return f"{dist.get_backend()} refuses: RuntimeError: {str(error).splitlines()[0]}"
    return f"{dist.get_backend()} gathers it"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps of each run (default 6)")
    parser.add_argument("--out", type=Path, required=True, help="folder for fsdp.json")
    args = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if GLOBAL_BATCH % world_size:
        parser.error(f"the global batch of {GLOBAL_BATCH} problems does not split over {world_size} processes")
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    device = setup()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    results = {name: run(name, args, device, mesh) for name in RUNS}
    alone = float8_alone(device, mesh)
    matmuls = "emulated in float32" if float8.emulate_here(device) else "FP8 tensor cores (torch._scaled_mm)"
    print0(f"FSDP2 on {dist.get_world_size()} ranks, {args.steps} steps; FP8 matmuls {matmuls}")
    header = f"{'run':28} {'FP8 linears':>11} {'gathers/step':>12} {'bytes/step':>11} {'dtypes':>15}"
    print0(f"{header} {'amax all-reduces':>16}")
    for name, r in results.items():
        # torchao reduces the amaxes with the functional all_reduce; the loss's is c10d's allreduce.
        reduces = r["collectives"][-1].get("all_reduce", 0)
        dtypes = "+".join(r["all_gather_dtypes"])
        print0(
            f"{name:28} {r['converted']:>11} {r['all_gathers'][-1]:>12} {r['all_gather_bytes'][-1]:>11,} "
            f"{dtypes:>15} {reduces:>16}"
        )
    print0(f"a unit whose weights are all FP8: {alone}")
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"world_size": dist.get_world_size(), "steps": args.steps, "runs": results, "float8_alone": alone}
        (args.out / "fsdp.json").write_text(json.dumps(report, indent=1))
        print0(f"wrote {args.out / 'fsdp.json'}")
    return 0


if __name__ == "__main__":
    code = main()
    teardown()
    sys.exit(code)
