"""Lab 04's check of the two mistakes a CPU cannot show names each, injected into the solution's fixed
script: the check cell reads the script (its syntax tree), here in this process; nothing is launched.
The mistakes a CPU run shows are tests/launches/test_slips_lab04.py's."""

from pathlib import Path

import pytest

from lab_injection import cell, first_failure, kernel_in, script
from parallel_course.checks import check_equal
from parallel_course.slips import ddp_bug_hunt
from slip_injection import inject

LAB = "lab04_ddp_bug_hunt.ipynb"
SETUP = "    device = setup()\n"
MOVED_FIRST = "    model = SimpleModel().to(device)  # FIX: move first ...\n"
WRAPPED = "  # FIX: ... then wrap (M7)\n"
# mistake -> (substitutions in the solution's script, what the FAIL line names)
SLIPS = {
    "a device from RANK": (
        [
            (
                SETUP,
                SETUP
                + '    if device.type == "cuda":\n        device = torch.device(f"cuda:{os.environ[\'RANK\']}")\n',
            )
        ],
        "FAIL no device picked from the global rank: expected True, got False: line ",
    ),
    "a device from get_rank() through a name": (
        [
            (
                SETUP,
                SETUP + "    index = dist.get_rank() % torch.cuda.device_count()\n    torch.cuda.set_device(index)\n",
            )
        ],
        "picks a device from the global rank (torch.cuda.set_device(index)): on the second node cuda:RANK",
    ),
    "the model moved after the wrap": (
        [(MOVED_FIRST, "    model = SimpleModel()\n"), (WRAPPED, WRAPPED + "    model.to(device)\n")],
        "moves the model once DDP has wrapped it (model.to(device)): DDP registered its parameters where they were",
    ),
    "the wrapper moved": (
        [(MOVED_FIRST, "    model = SimpleModel()\n"), (WRAPPED, WRAPPED + "    ddp_model = ddp_model.cuda()\n")],
        "moves the model once DDP has wrapped it (ddp_model = ddp_model.cuda())",
    ),
}


@pytest.mark.parametrize("slip", SLIPS)
def test_the_source_check_names_the_mistake(tmp_path, slip):
    substitutions, named = SLIPS[slip]
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "lab04_fixed.py").write_text(inject(script(LAB, "lab04_fixed.py"), substitutions))
    with kernel_in(tmp_path):
        # What the check cell takes from the lab's setup cell.
        failure = first_failure([cell(LAB, "c17")], {"Path": Path, "check_equal": check_equal, "slips": ddp_bug_hunt})
    assert named in failure, failure
