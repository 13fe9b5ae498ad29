"""Lab 03's checker names the likely slips of a ring all-reduce: each slip injected into the solution's
ring, every variant checked by the checker's own ``check`` in one torchrun of 2 ranks (the patterns
of more ranks: tests/unit/test_slips_ring_allreduce.py)."""

import re
from pathlib import Path

import pytest

from helpers import job_command, launch
from lab_injection import injected, script

LAB = "lab03_ring_allreduce.ipynb"
RING = script(LAB, "lab03_ring.py")
CHECKER = script(LAB, "lab03_check.py")
ROOT = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2

# slip -> (the solution's text, what a student wrote instead, what the FAIL line names)
SLIPS = {
    "overwrite in the reduce-scatter": (
        "mine.add_(incoming)",
        "mine.copy_(incoming)",
        "chunk j those of rank j, not the sum: does the reduce-scatter overwrite what it receives",
    ),
    "a reduce-scatter a step short": (
        "    for s in range(n - 1):\n        mine = ",
        "    for s in range(n - 2):\n        mine = ",
        "the all-gather spreads chunks the reduce-scatter never summed",
    ),
    "an all-gather a step short": (
        "    for s in range(n - 1):\n        exchange(chunks[(rank + 1 - s) % n]",
        "    for s in range(n - 2):\n        exchange(chunks[(rank + 1 - s) % n]",
        "one chunk holds a partial sum and the others the full sum: does the all-gather run all N - 1 steps?",
    ),
    "an all-gather that adds": (
        "        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])\n",
        "        incoming = torch.empty_like(chunks[(rank - s) % n])\n"
        "        exchange(chunks[(rank + 1 - s) % n], incoming)\n"
        "        chunks[(rank - s) % n].add_(incoming)\n",
        "some chunks count a rank's values twice or more: does the all-gather add what it receives",
    ),
    "the average, not the sum": (
        "chunks[(rank - s) % n])\n    return tensor\n",
        "chunks[(rank - s) % n])\n    return tensor.div_(n)\n",
        "every element is 1/2 of the sum: is the sum divided by the world size?",
    ),
    "not in place": (
        "chunks = tensor.view(-1).tensor_split(n)",
        "chunks = tensor.flatten().clone().tensor_split(n)",
        "every rank's tensor still holds its own values: is the sum written into the tensor it was given",
    ),
}
# Last: it leaves the group unusable, and the checker exits there.
DEADLOCK = (
    "        if rank % 2 == 0:\n"
    "            dist.send(outgoing, dst=right)\n"
    "            dist.recv(incoming, src=left)\n"
    "        else:\n"
    "            dist.recv(incoming, src=left)\n"
    "            dist.send(outgoing, dst=right)\n",
    "        dist.send(outgoing, dst=right)\n        dist.recv(incoming, src=left)\n",
    "a send or receive timed out: does every rank wait in a blocking send (or recv) for a neighbour",
)

# Checks every variant named on the command line with lab03_check.check, rank 0 printing its lines
# after a "== name" line; the last one, the deadlock, timing out after 2 s.
DRIVER = """
import functools
import importlib
import sys
from datetime import timedelta

import torch.distributed as dist

import lab03_check
from dist_setup import setup

device = setup()
*variants, deadlock = sys.argv[1:]
for name in variants:
    lines, _ = lab03_check.check(importlib.import_module(name).ring_allreduce, device)
    if dist.get_rank() == 0:
        print(f"== {name}", *lines, sep="\\n", flush=True)
# The deadlock's sends and receives in a group of their own that times out at 2 s, not 30.
short = dist.new_group(timeout=timedelta(seconds=2))
dist.send, dist.recv = functools.partial(dist.send, group=short), functools.partial(dist.recv, group=short)
lab03_check.check(importlib.import_module(deadlock).ring_allreduce, device)
"""


def module_name(slip: str) -> str:
    return "ring_" + re.sub(r"\W+", "_", slip)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Per slip, the checker's FAIL lines for the ring with that slip."""
    tmp = tmp_path_factory.mktemp("lab03")
    (tmp / "dist_setup.py").write_text((ROOT / "scripts" / "dist_setup.py").read_text())
    (tmp / "lab03_ring.py").write_text(RING)
    (tmp / "lab03_check.py").write_text(CHECKER)
    (tmp / "driver.py").write_text(DRIVER)
    for slip, (old, new, _) in [*SLIPS.items(), ("deadlock", DEADLOCK)]:
        (tmp / f"{module_name(slip)}.py").write_text(injected(RING, old, new))
    names = [module_name(slip) for slip in [*SLIPS, "deadlock"]]
    result = launch(job_command(tmp / "driver.py", WORLD_SIZE, *names), cwd=tmp, timeout=180)
    found, current = {"deadlock": [line for line in result.stderr.splitlines() if line.startswith("FAIL")]}, None
    for line in result.stdout.splitlines():
        if line.startswith("== "):
            current = found.setdefault(line[3:], [])
        elif current is not None and line.startswith("FAIL"):
            current.append(line)
    return {slip: found.get(module_name(slip), []) for slip in SLIPS} | {"deadlock": found["deadlock"]}


@pytest.mark.parametrize("slip", [*SLIPS, "deadlock"])
def test_the_checker_names_the_slip(verdicts, slip):
    named = SLIPS[slip][2] if slip in SLIPS else DEADLOCK[2]
    failures = verdicts[slip]
    assert failures, f"no FAIL line for the ring with {slip}"
    if slip == "deadlock":
        # it ends the check at the first case, on each rank that timed out (a rank the machine held
        # up past the others' timeout finds its peer gone instead)
        told = failures
        assert all(line.startswith("FAIL world_size=2 length=1: rank ") for line in told), "\n".join(failures)
    else:
        # every case long enough to tell (more elements per chunk than ranks) names it
        told = [line for line in failures if re.search(r"length=(7|1000|1001|21)\b", line)]
        assert len(told) == 4, "\n".join(failures)
    assert all(named in line for line in told), "\n".join(failures)
