"""Lab 05's checker names the likely slips of a DDP of one's own: each injected into the solution's
classes, every variant checked by the checker's own ``check_wrapper`` in one torchrun of 2 ranks
(one reference for all, one training step: the slips show in its gradients; no timing)."""

import re
from pathlib import Path

import pytest

from helpers import job_command, launch
from lab_injection import injected, script

LAB = "lab05_build_your_own_ddp.ipynb"
MINE = script(LAB, "lab05_my_ddp.py")
CHECKER = script(LAB, "lab05_check.py")
ROOT = Path(__file__).resolve().parents[2]

# slip -> (the class it is in, the solution's text, what a student wrote instead, what rank 1's FAIL line names)
SLIPS = {
    "the sum, not the average": (
        "DDP",
        "        param.grad.div_(self.world_size)\n",
        "",
        "every gradient of step 1 is 2.00x the reference's: is the sum over the ranks divided by the world size?",
    ),
    "divided twice": (
        "DDP",
        "dist.all_reduce(param.grad, async_op=True)",
        "dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, async_op=True)",
        "every gradient of step 1 is 0.50x the reference's: is the average divided by the world size once more?",
    ),
    "parameters not broadcast": (
        "DDP",
        "for tensor in list(module.parameters()) + list(module.buffers()):",
        "for tensor in module.buffers():",
        "after wrapping, this rank's parameters (e.g. embed.weight) are its own, not rank 0's",
    ),
    "buffers not broadcast": (
        "DDP",
        "for tensor in list(module.parameters()) + list(module.buffers()):",
        "for tensor in module.parameters():",
        "after wrapping, this rank's buffer position is its own, not rank 0's: are the buffers broadcast too?",
    ),
    "averages never copied back": (
        "BucketedDDP",
        "            for param, average in zip(bucket, torch.split(self.flat[i], self.numels[i])):\n"
        "                if param.grad is None:\n"
        "                    param.grad = average.view_as(param).clone()\n"
        "                else:\n"
        "                    param.grad.copy_(average.view_as(param))\n",
        "",
        "every gradient of step 1 is this rank's own, of its shard alone: do the all-reduced values reach .grad?",
    ),
}

# Checks each variant (module:class) named on the command line with lab05_check.check_wrapper, rank 0
# printing every rank's verdicts after a "== module" line.
DRIVER = """
import importlib
import sys

import torch.distributed as dist

import lab05_check as check
from dist_setup import setup, teardown

device = setup()
rank, world_size = dist.get_rank(), dist.get_world_size()
data, shard = check.batches(1, rank, world_size)
ref = check.reference(data, shard, device)
for variant in sys.argv[1:]:
    name, kind = variant.split(":")
    cls = getattr(importlib.import_module(name), kind)
    wrap = (lambda m: cls(m)) if kind == "DDP" else (lambda m: cls(m, bucket_size_mb=4))
    verdicts, _, _ = check.check_wrapper(kind, wrap, shard, ref, device)
    every = [None] * world_size
    dist.all_gather_object(every, verdicts)
    if rank == 0:
        print(f"== {name}", *[f"rank {r}: {v}" for r, vs in enumerate(every) for v in vs], sep="\\n", flush=True)
teardown()
"""


def module_name(slip: str) -> str:
    return "mine_" + re.sub(r"\W+", "_", slip)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Per slip, the checker's lines for the class with that slip."""
    tmp = tmp_path_factory.mktemp("lab05")
    (tmp / "dist_setup.py").write_text((ROOT / "scripts" / "dist_setup.py").read_text())
    (tmp / "lab05_my_ddp.py").write_text(MINE)
    (tmp / "lab05_check.py").write_text(CHECKER)
    (tmp / "driver.py").write_text(DRIVER)
    for slip, (_, old, new, _) in SLIPS.items():
        (tmp / f"{module_name(slip)}.py").write_text(injected(MINE, old, new))
    variants = [f"{module_name(slip)}:{kind}" for slip, (kind, *_) in SLIPS.items()]
    result = launch(job_command(tmp / "driver.py", 2, *variants), cwd=tmp, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    found, current = {}, None
    for line in result.stdout.splitlines():
        if line.startswith("== "):
            current = found.setdefault(line[3:], [])
        elif current is not None:
            current.append(line)
    return {slip: found.get(module_name(slip), []) for slip in SLIPS}


@pytest.mark.parametrize("slip", SLIPS)
def test_the_checker_names_the_slip(verdicts, slip):
    kind, _, _, named = SLIPS[slip]
    weights = [line for line in verdicts[slip] if line.startswith("rank 1: FAIL") and "all weights" in line]
    assert weights and named in weights[0], "\n".join(verdicts[slip])
