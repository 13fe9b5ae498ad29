"""Lab 09's check 1 (in the kernel) names the slip injected into the solution's checkpoint code.

The check cell runs here as the kernel runs it (a process group of one, in this process), with
the solution's lab09_train.py (a slip injected) in a work/ folder of its own; no process is
launched. Check 2's diagnosis, which needs a crash and a restart, is tested in
tests/launches/test_slips_lab09.py.
"""

import importlib
import shutil
import sys
from pathlib import Path

import pytest
import torch

from helpers import LAUNCHER_VARIABLES
from lab_injection import kernel_in
from parallel_course.checks import CheckFailed
from slip_injection import code_cell, inject, lab_folder

SOLUTION = "lab09_resume_exactly.ipynb"
REPLACE = "    os.replace(tmp, path)  # atomic: readers see the old file or the new one\n"
WATCHED = (
    "FAIL what the checkpoint's path holds at every line of a save: expected ['the old file', 'the new file'], got "
)
# slip -> (substitutions on the solution's lab09_train.py, the FAIL line's start, the slip's words).
SLIPS = {
    "step_not_returned": (
        [('    return state["step"]\n', "")],
        "FAIL step returned by restore: expected 3, got None",
        "restore returned nothing",
    ),
    "weights_not_restored": (
        [('    model.module.load_state_dict(state["model"])\n', "")],
        "FAIL weights restored: expected True, got False",
        "restore left the fresh model's weights as they were",
    ),
    "optimizer_not_restored": (
        [('    optimizer.load_state_dict(state["optimizer"])\n', "")],
        "FAIL Adam's moments restored: expected True, got False",
        "the restored optimizer has no state at all",
    ),
    "scheduler_not_restored": (
        [('    scheduler.load_state_dict(state["scheduler"])\n', "")],
        "FAIL learning rate restored: expected [0.005], got [0.01]",
        "the schedule starts over",
    ),
    "rng_not_restored": (
        [('    torch.set_rng_state(rng["cpu"].cpu())\n', "")],
        "FAIL this rank's RNG restored: expected True, got False",
        "restore left the RNG where it was",
    ),
    "saved_in_place": (
        [('tmp = path.with_name(path.name + ".tmp")', "tmp = path")],
        WATCHED + "['the old file', 'a file of 0 bytes', ",
        "the checkpoint's own path held a partial file: is the new one written (or copied) into it?",
    ),
    "removed_first": (
        [(REPLACE, "    if path.exists():\n        os.remove(path)\n    os.rename(tmp, path)\n")],
        WATCHED + "['the old file', 'no file', 'the new file']",
        "for a while there was no checkpoint at all: is the old file removed before the new one takes its place?",
    ),
    "copied": (
        [(REPLACE, "    import shutil\n\n    shutil.copyfile(tmp, path)\n")],
        WATCHED + "['the old file', 'a file of 0 bytes', 'the new file']",
        "the checkpoint's own path held a partial file",
    ),
}


@pytest.mark.parametrize("slip", SLIPS)
def test_check_1_names_the_slip(tmp_path, monkeypatch, slip):
    substitutions, fail, named = SLIPS[slip]
    work = lab_folder(SOLUTION, tmp_path / "work")
    script = work / "lab09_train.py"
    script.write_text(inject(script.read_text(), substitutions))
    cell = code_cell(SOLUTION, "check_named(")
    kernel = {"importlib": importlib, "shutil": shutil, "sys": sys, "Path": Path, "torch": torch}
    # The cell's setup() makes a group of one here, as in a kernel started without a launcher.
    for variable in LAUNCHER_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    # The cell puts the relative path "work" on sys.path: its cached finder is an earlier test's folder.
    monkeypatch.setattr(sys, "path_importer_cache", {k: v for k, v in sys.path_importer_cache.items() if k != "work"})
    with kernel_in(tmp_path), pytest.raises(CheckFailed) as failed:
        exec(cell, kernel)
    assert str(failed.value).startswith(fail), str(failed.value)
    assert named in str(failed.value), str(failed.value)
