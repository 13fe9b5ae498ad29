"""Lab 13's in-kernel check of merge names the slip injected into the solution's merge.

The check cell runs here as the kernel runs it, with the solution's lab13_ring.py (a slip injected)
as the module it imports; no process is launched.
"""

import importlib
import sys

import pytest
import torch

from lab_injection import kernel_in
from parallel_course.checks import CheckFailed
from slip_injection import code_cell, inject, lab_folder

SOLUTION = "lab13_ring_attention.ipynb"
MERGED = "return weight_a * out_a + weight_b * out_b, lse"
LSE = "lse = torch.logaddexp(lse_a, lse_b)"
WEIGHTS = "weight_a, weight_b = torch.exp(lse_a - lse)[..., None], torch.exp(lse_b - lse)[..., None]"
# slip -> (substitutions on the solution's lab13_ring.py, the case that fails, the words its FAIL line must hold).
SLIPS = {
    "average": ([(MERGED, "return (out_a + out_b) / 2, lse")], "lse about 2: out", "the output: it averages"),
    "sum": ([(MERGED, "return out_a + out_b, lse")], "lse about 2: out", "the output: it adds the two outputs"),
    "not_normalised": (
        [(WEIGHTS, "weight_a, weight_b = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]")],
        "lse about 2: out",
        "weights exp(lse_a) and exp(lse_b) are not divided by their sum",
    ),
    "swapped": (
        [(MERGED, "return weight_b * out_a + weight_a * out_b, lse")],
        "lse about 2: out",
        "the weights are swapped",
    ),
    "lse_kept": ([(MERGED, MERGED.replace("lse", "lse_a"))], "lse about 2: lse", "the lse: it is lse_a unchanged"),
    "lse_max": ([(LSE, "lse = torch.maximum(lse_a, lse_b)")], "lse about 2: out", "the lse: it is the larger"),
    "overflow": (
        [(LSE, "lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))")],
        "lse about 100 (exp overflows float32): out",
        "did exp() overflow?",
    ),
}


def run_check(tmp_path, substitutions):
    """The lab's merge check cell, run on the solution's file with ``substitutions`` made: its output."""
    work = lab_folder(SOLUTION, tmp_path / "work")
    student = work / "lab13_ring.py"
    student.write_text(inject(student.read_text(), substitutions))
    cell = code_cell(SOLUTION, "check_merge(lab13_ring.merge)")
    with kernel_in(tmp_path):
        # The lab's setup cell puts work/ on the path.
        sys.path.insert(0, str(work))
        exec(cell, {"importlib": importlib, "torch": torch})


@pytest.mark.parametrize("slip", SLIPS)
def test_the_merge_check_names_the_slip(tmp_path, slip):
    substitutions, case, named = SLIPS[slip]
    with pytest.raises(CheckFailed) as failed:
        run_check(tmp_path, substitutions)
    message = str(failed.value)
    assert message.startswith(f"FAIL merge of 2 key blocks (6 and 3 keys) vs attention over all 9, {case}"), message
    assert named in message, message
