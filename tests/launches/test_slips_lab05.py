"""Lab 05's checker names the likely slips of a DDP of one's own, and the answers that skip its point
(no all-reduce started while backward runs, one flat bucket): each injected into the solution's
classes, every variant checked by the checker's own ``check_wrapper`` in one launch of 2 ranks (one
reference for all, two training steps: the slips show in the all-reduces counted, the weights
after wrapping and the gradients; no timing)."""

import re
from pathlib import Path

import pytest

from helpers import job_command, launch
from lab_injection import injected, script

LAB = "lab05_build_your_own_ddp.ipynb"
FILES = {"DDP": "lab05_my_ddp.py", "BucketedDDP": "lab05_my_bucketed_ddp.py"}
ROOT = Path(__file__).resolve().parents[2]
COUNTED = "FAIL {}: all-reduces per step: expected "
WEIGHTS = "FAIL {} vs one process (large batch), all weights"
WAIT_ALL = "        for handle in self.handles:\n            handle.wait()\n"
HOOK = "param.register_post_accumulate_grad_hook(self._on_grad_ready)"
RESET = (
    "        # Gradients ready per bucket.\n        self.ready = [0] * len(self.buckets)\n"
    "        # The flattened bucket being all-reduced.\n        self.flat = [None] * len(self.buckets)\n"
    "        self.handles = [None] * len(self.buckets)\n"
)

# slip -> (the class it is in, its substitutions (old, new) of the solution's file, the check its FAIL
# line is (COUNTED or WEIGHTS), what that line names)
SLIPS = {
    "the sum, not the average": (
        "DDP",
        [("        param.grad.div_(self.world_size)\n", "")],
        WEIGHTS,
        "every gradient of step 1 is 2.00x the reference's: is the sum over the ranks divided by the world size?",
    ),
    "divided twice": (
        "DDP",
        [
            (
                "dist.all_reduce(param.grad, async_op=True)",
                "dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, async_op=True)",
            )
        ],
        WEIGHTS,
        "every gradient of step 1 is 0.50x the reference's: is the average divided by the world size once more?",
    ),
    "parameters not broadcast": (
        "DDP",
        [("for tensor in list(module.parameters()) + list(module.buffers()):", "for tensor in module.buffers():")],
        WEIGHTS,
        "after wrapping, this rank's parameters (e.g. embed.weight) are its own, not rank 0's, its buffers rank 0's: "
        "are the parameters broadcast, in place?",
    ),
    "buffers not broadcast": (
        "DDP",
        [("for tensor in list(module.parameters()) + list(module.buffers()):", "for tensor in module.parameters():")],
        WEIGHTS,
        "after wrapping, this rank's buffer position is its own, not rank 0's: are the buffers broadcast too?",
    ),
    # The point skipped: no hook, every gradient all-reduced once backward is over.
    "no overlap: all-reduced after backward": (
        "DDP",
        [
            (HOOK, "pass"),
            (
                WAIT_ALL,
                "        for param in self.module.parameters():\n            if param.grad is not None:\n"
                "                self._on_grad_ready(param)\n" + WAIT_ALL,
            ),
        ],
        COUNTED,
        "none started while backward still had gradients to compute: the overlap is the point; does a hook "
        "(register_post_accumulate_grad_hook) start each one as soon as its gradient is ready?",
    ),
    "no wait": (
        "DDP",
        [(WAIT_ALL, "")],
        COUNTED,
        "17 of step 1's 17 all-reduce(s) never waited for before the update: finish_gradient_synchronization() must "
        "wait() for every one",
    ),
    "blocking all-reduces in the hook": (
        "DDP",
        [("self.handles.append(dist.all_reduce(param.grad, async_op=True))", "dist.all_reduce(param.grad)")],
        COUNTED,
        "17 blocking all-reduce(s): backward stops at each until it is done; pass async_op=True",
    ),
    "a stub left in DDP": (
        "DDP",
        [("        param.grad.div_(self.world_size)\n", "        raise NotImplementedError()\n")],
        "FAIL {}: ",
        "DDP._on_grad_ready is not written yet (it raises NotImplementedError)",
    ),
    "averages never copied back": (
        "BucketedDDP",
        [
            (
                "            for param, average in zip(bucket, torch.split(self.flat[i], self.numels[i])):\n"
                "                if param.grad is None:\n"
                "                    param.grad = average.view_as(param).clone()\n"
                "                else:\n"
                "                    param.grad.copy_(average.view_as(param))\n",
                "",
            )
        ],
        WEIGHTS,
        "every gradient of step 1 is this rank's own, of its shard alone: do the all-reduced values reach .grad?",
    ),
    # The point skipped: every gradient in one bucket, all-reduced once backward is over.
    "one flat bucket": (
        "BucketedDDP",
        [("cap = bucket_size_mb * 2**20", 'cap = float("inf")')],
        COUNTED,
        "one flat all-reduce of every gradient: are the gradients cut into buckets of bucket_size_mb?",
    ),
    "buckets all-reduced after backward": (
        "BucketedDDP",
        [("        if self.ready[i] == len(self.buckets[i]):\n            self._launch(i)\n", "")],
        COUNTED,
        "none started while backward still had gradients to compute: the overlap is the point; does a hook "
        "(register_post_accumulate_grad_hook) start a bucket's all-reduce as soon as its last gradient is ready?",
    ),
    # The per-step state set once, in __init__, and never reset.
    "no reset in on_train_batch_start": (
        "BucketedDDP",
        [
            (RESET, "        pass\n"),
            (f"{HOOK}\n        self.on_train_batch_start()\n", f"{HOOK}\n" + RESET),
            (
                "                    param.grad.copy_(average.view_as(param))\n        self.on_train_batch_start()\n",
                "                    param.grad.copy_(average.view_as(param))\n",
            ),
        ],
        WEIGHTS,
        "step 2 starts no all-reduce, step 1 started 3: is the per-step state (the gradients counted per bucket, "
        "the pending all-reduces) reset in on_train_batch_start()?",
    ),
    "a stub left in BucketedDDP": (
        "BucketedDDP",
        [
            (
                "        grads = [p.grad if p.grad is not None",
                "        raise NotImplementedError()\n        grads = [p.grad if p.grad is not None",
            )
        ],
        "FAIL {}: ",
        "BucketedDDP._launch is not written yet (it raises NotImplementedError)",
    ),
}

# Checks each variant (module:class) named on the command line with lab05_check.check_wrapper for 2
# steps, its all-reduces counted; rank 0 prints every rank's verdicts after a "== module" line.
DRIVER = """
import importlib
import sys

import torch.distributed as dist

import lab05_check as check
from dist_setup import setup, teardown

device = setup()
rank, world_size = dist.get_rank(), dist.get_world_size()
data, shard = check.batches(2, rank, world_size)
ref = check.reference(data, shard, device)
for variant in sys.argv[1:]:
    name, kind = variant.split(":")
    module = importlib.import_module(name)
    cls = getattr(module, kind)
    wrap = (lambda m: cls(m)) if kind == "DDP" else (lambda m: cls(m, bucket_size_mb=4))
    modules = [module] + ([importlib.import_module("lab05_my_ddp")] if kind == "BucketedDDP" else [])
    verdicts, _, _ = check.check_wrapper(kind, wrap, shard, ref, device, modules, 4 if kind == "BucketedDDP" else None)
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
    for name in [*FILES.values(), "lab05_check.py"]:
        (tmp / name).write_text(script(LAB, name))
    (tmp / "driver.py").write_text(DRIVER)
    for slip, (kind, substitutions, _, _) in SLIPS.items():
        text = script(LAB, FILES[kind])
        for old, new in substitutions:
            text = injected(text, old, new)
        (tmp / f"{module_name(slip)}.py").write_text(text)
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
    kind, _, check, named = SLIPS[slip]
    lines = [line for line in verdicts[slip] if line.startswith(f"rank 1: {check.format(kind)}")]
    assert lines and named in lines[0], "\n".join(verdicts[slip])
