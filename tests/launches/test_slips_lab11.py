"""Lab 11's checker names the slip injected into the solution: each variant's FAIL line says it.

All variants run in one launch on 2 processes (tests/slip_driver.py), for 2 steps instead of 6
(every slip shows in the first), the one-process reference trained once for them all.
"""

import pytest

from slip_injection import assert_fail_names, check_variants, lab_folder

SOLUTION = "lab11_zero3_by_hand.ipynb"
# slip -> (substitutions on the solution's lab11_zero3.py, the words its FAIL line must hold).
SLIPS = {
    "sum": (
        [("return out / world_size, None", "return out, None")],
        "every gradient is 2.00x the reference's: does backward return the sum instead of the average?",
    ),
    "no_recompute": (
        [
            (
                "return checkpoint(run, self.shards[index], *inputs, use_reentrant=False)",
                "return run(self.shards[index], *inputs)",
            )
        ],
        "got (20, 0, 20): no all-gather in backward: does the layer's forward go through checkpoint(...)?",
    ),
    "all_reduce": (
        [
            (
                "dist.reduce_scatter_single(out, padded)",
                "dist.all_reduce(padded)\n        out = padded.chunk(world_size)[dist.get_rank()].clone()",
            )
        ],
        "got (20, 20, 0): backward all-reduces the gradients instead of reduce-scattering them",
    ),
    "not_freed": (
        [
            (
                "                for name in self.names[index]:\n                    setattr(layer, name, None)\n",
                "                pass\n",
            )
        ],
        "is still set on its layer after forward: are the whole parameters set back to None",
    ),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab11"))
    slips = {name: substitutions for name, (substitutions, _) in SLIPS.items()}
    return check_variants(
        folder, "lab11_check.py", "lab11_zero3", slips, once=["reference_run"], constants={"STEPS": 2}
    )


@pytest.mark.parametrize("slip", SLIPS)
def test_the_fail_line_names_the_slip(checked, slip):
    assert_fail_names(checked[slip], SLIPS[slip][1])
