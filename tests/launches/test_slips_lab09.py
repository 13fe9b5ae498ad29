"""Lab 09's check 2 names the slip injected into the solution: only rank 0's RNG state saved and
restored on every rank (check 1, a group of one, cannot see it).

Check 2's cell runs here as the kernel runs it, its launch replaced by one launch whose workers run
the uninterrupted job, then the job that stops after step 9 (where the real one crashes in step
10), then the same job again as torchrun's restart would: it resumes from the checkpoint of step 8.
A real crash and restart is the solution notebook's own check 2.
"""

import shutil
from pathlib import Path

import pytest
import torch

from parallel_course.checks import CheckFailed
from parallel_course.slips.resume import read_fingerprints, restart_slip
from slip_injection import code_cell, inject, lab_folder, launch_two

SOLUTION = "lab09_resume_exactly.ipynb"
# Only rank 0's RNG state in the checkpoint, and every rank restoring it.
RANK_0_RNG = [
    ("    dist.all_gather_object(rng_states, rng)  # every rank's, not only rank 0's\n", ""),
    ('"rng": rng_states,', '"rng": rng,'),
    ('rng = state["rng"][dist.get_rank()]  # this rank\'s own', 'rng = state["rng"]'),
]
# The jobs of check 2 in one launch: the uninterrupted one, then the one that crashes, and its restart.
BOTH_JOBS = """
import sys

import lab09_train as job
from dist_setup import setup, teardown

device = setup()
# main() joins through setup(): the group already joined.
job.setup = lambda: device
reference, crash = sys.argv[1:3]
for argv, attempt in [(["--out", reference], 0), (["--out", crash, "--steps", "9"], 0), (["--out", crash], 1)]:
    sys.argv, job.RESTART = ["lab09_train.py", *argv], attempt
    job.main()
teardown()
"""


def both_jobs(folder: Path):
    """check 2's torchrun: one launch of its jobs, in ``folder``."""

    def torchrun(script, *args, world_size, max_restarts=0):
        assert (script, args[:2], world_size, max_restarts) == (
            "work/lab09_train.py",
            ("--out", "work/lab09_crash"),
            2,
            1,
        )
        driver = folder / "work" / "both_jobs.py"
        driver.write_text(BOTH_JOBS)
        result = launch_two(driver, "work/lab09_ref", "work/lab09_crash", cwd=folder)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    return torchrun


def test_check_2_names_another_ranks_rng(tmp_path, monkeypatch):
    work = lab_folder(SOLUTION, tmp_path / "work")
    script = work / "lab09_train.py"
    script.write_text(inject(script.read_text(), RANK_0_RNG))
    cell = code_cell(SOLUTION, "restart_slip(")
    kernel = {"shutil": shutil, "torch": torch, "torchrun": both_jobs(tmp_path), "CheckFailed": CheckFailed}
    kernel.update({"read_fingerprints": read_fingerprints, "restart_slip": restart_slip})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckFailed) as failed:
        exec(cell, kernel)
    fail = str(failed.value)
    assert fail.startswith("FAIL final weights after crash + restart: expected equal to the uninterrupted run"), fail
    # The one thing the restart failed to bring back, named whole.
    assert fail.endswith(
        ": rank 1 resumed with rank 0's RNG state: every rank draws its own dropout masks, so each needs its own "
        "state back"
    ), fail
