"""Lab 11's in-kernel check of shard_of names the slip injected into the solution's shard_of.

The check cell runs here as the kernel runs it, with the solution's lab11_zero3.py (a slip
injected) as the module it imports; no process is launched.
"""

import importlib
import sys

import pytest
import torch

from lab_injection import kernel_in
from parallel_course.checks import CheckFailed
from slip_injection import code_cell, inject, lab_folder

SOLUTION = "lab11_zero3_by_hand.ipynb"
CUT = "padded = torch.cat([flat, flat.new_zeros(size * world_size - flat.numel())])"
PIECE = "return padded[rank * size : (rank + 1) * size].clone()"
# slip -> substitutions on the solution's lab11_zero3.py, and the words its FAIL line must hold.
SLIPS = {
    "floor": (
        [("size = -(-flat.numel() // world_size)", "size = flat.numel() // world_size"), (CUT, "padded = flat")],
        "every piece has numel // world_size = 3 elements, so the last 1 element(s) are in no piece: pieces must be "
        "ceil(numel / world_size) = 4 long",
    ),
    "not_padded": ([(CUT, "padded = flat")], "the last piece has 2 elements and the others 4"),
    "strided": (
        [(PIECE, "return padded[rank::world_size].clone()")],
        "piece r holds elements r, r + 3, r + 6, ... (a stride)",
    ),
    "same_piece": ([(PIECE, "return padded[:size].clone()")], "every rank gets the same piece"),
    "view": (
        [(PIECE, PIECE.replace(".clone()", ""))],
        "right values, but the piece of rank 0 is a view into a tensor of 12 elements",
    ),
}


@pytest.mark.parametrize("slip", SLIPS)
def test_the_shard_of_check_names_the_slip(tmp_path, slip):
    substitutions, named = SLIPS[slip]
    work = lab_folder(SOLUTION, tmp_path / "work")
    student = work / "lab11_zero3.py"
    student.write_text(inject(student.read_text(), substitutions))
    cell = code_cell(SOLUTION, "check_pieces(")
    with kernel_in(tmp_path), pytest.raises(CheckFailed) as failed:
        # The lab's setup cell puts work/ on the path.
        sys.path.insert(0, str(work))
        exec(cell, {"importlib": importlib, "torch": torch})
    assert str(failed.value).startswith("FAIL shard_of(1..10, rank, 3)")
    assert named in str(failed.value), str(failed.value)
