"""Lab 04's checks name the likely mistakes left in a fixed script: each injected into the solution's
script, every variant trained in one torchrun of 2 ranks (one group, each variant's main() in turn),
then each run's files handed to the lab's own check cell, run in this process with its launch
replaced by a copy of that run's files."""

import re
import shutil
from pathlib import Path

import pytest

from helpers import job_command, launch
from lab_injection import cell, first_failure, injected, kernel_in, run_cell, script

LAB = "lab04_ddp_bug_hunt.ipynb"
FIXED = script(LAB, "lab04_fixed.py")
ROOT = Path(__file__).resolve().parents[2]

# mistake -> (substitutions in the solution's script, what the FAIL line names)
SLIPS = {
    "every rank writes the checkpoint": (
        [
            (
                "    if rank == 0:  # FIX: one writer\n        save_checkpoint(ddp_model.module.state_dict(), "
                'args.out / "final.pt")\n        (args.out / "metrics.json")',
                '    save_checkpoint(ddp_model.module.state_dict(), args.out / "final.pt")\n'
                '    (args.out / "metrics.json")',
            )
        ],
        "FAIL processes that wrote final.pt: expected ['rank 0'], got ['rank 0', 'rank 1']: 2 writes, by rank 0, "
        "rank 1: does every rank save the checkpoint?",
    ),
    "no sampler": (
        [
            ("sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)", "sampler = None"),
            (
                "DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)",
                "DataLoader(dataset, batch_size=args.batch_size, shuffle=True)",
            ),
            ("sampler.set_epoch(epoch)", "pass"),
        ],
        "these are the weights of every rank reading the whole data set, the same batches on each",
    ),
    "no set_epoch": (
        [("sampler.set_epoch(epoch)", "pass")],
        "these are the weights of one order in every epoch: is the sampler told the epoch?",
    ),
    "divided by the last index": (
        [
            ("for X, y in loader:", "for i, (X, y) in enumerate(loader):"),
            ("running_loss / len(loader)", "running_loss / i"),
        ],
        "every epoch's loss is 1.0667x the reference's: divided by one batch too few (15, the last batch's index, "
        "where there are 16 batches)?",
    ),
    "rank 0's own loss": (
        [("dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)", "pass")],
        "these are rank 0's own losses: is the loss averaged over the ranks before it is logged?",
    ),
    "rank 0's own loss, divided by the last index": (
        [
            ("dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)", "pass"),
            ("for X, y in loader:", "for i, (X, y) in enumerate(loader):"),
            ("running_loss / len(loader)", "running_loss / i"),
        ],
        "these are rank 0's own losses, 1.0667x: averaged over the ranks, and divided by one batch too few",
    ),
    "summed over the ranks": (
        [("op=dist.ReduceOp.AVG", "op=dist.ReduceOp.SUM")],
        "every epoch's loss is 2.00x the reference's: is the sum over the ranks divided by the world size?",
    ),
}

# Trains every variant named on the command line, in turn, in the group it makes once: each
# variant's setup() returns that group's device. A variant's files go to runs/<name>.
DRIVER = """
import importlib
import sys

import torch.distributed as dist

import dist_setup

device = dist_setup.setup()
dist_setup.setup = lambda *args, **kwargs: device
for name in sys.argv[1:]:
    sys.argv = [name, "--batch-size", "32", "--out", f"runs/{name}"]
    importlib.import_module(name).main()
    dist.barrier()
dist_setup.teardown()
"""


def module_name(slip: str) -> str:
    return "fixed_" + re.sub(r"\W+", "_", slip)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per mistake, the folder its run wrote (final.pt, its writers, metrics.json)."""
    tmp = tmp_path_factory.mktemp("lab04")
    (tmp / "dist_setup.py").write_text((ROOT / "scripts" / "dist_setup.py").read_text())
    (tmp / "driver.py").write_text(DRIVER)
    for slip, (substitutions, _) in SLIPS.items():
        text = FIXED
        for old, new in substitutions:
            text = injected(text, old, new)
        (tmp / f"{module_name(slip)}.py").write_text(text)
    result = launch(job_command(tmp / "driver.py", 2, *map(module_name, SLIPS)), cwd=tmp, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return {slip: tmp / "runs" / module_name(slip) for slip in SLIPS}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """The lab's setup, its scripts and its reference, run once in a kernel of its own."""
    namespace = {}
    with kernel_in(tmp_path_factory.mktemp("kernel")):
        for cell_id in ("c02", "c04", "c06"):
            run_cell(cell(LAB, cell_id), namespace)
        yield namespace


def replay(run: Path):
    """A torchrun for the check cell that launches nothing: it copies ``run``'s files where --out says."""

    def torchrun(script, *args, **kwargs):
        shutil.copytree(run, args[args.index("--out") + 1])
        return ""

    return torchrun


@pytest.mark.parametrize("slip", SLIPS)
def test_the_check_names_the_mistake(runs, kernel, slip):
    namespace = dict(kernel, torchrun=replay(runs[slip]))
    failure = first_failure([cell(LAB, "c13")], namespace)
    assert SLIPS[slip][1] in failure, failure
