"""Lab 13's checker names the likely slips of ring attention: each slip injected into the solution's
lab13_ring.py, every variant checked by the checker's own main() in one torchrun of 4 ranks
(tests/slip_driver.py), the world size the lab checks at. The merge's in-kernel check and its slips:
tests/course/test_slips_lab13_merge.py; the recognisers on traces of 3 ranks:
tests/unit/test_slips_ring_attention.py."""

import json

import pytest

from helpers import job_command, launch
from slip_injection import DRIVER, assert_fail_names, lab_folder, write_variants

SOLUTION = "lab13_ring_attention.ipynb"
WORLD_SIZE = 4
MERGED = "return weight_a * out_a + weight_b * out_b, lse"
OWN = "out, lse = attend(q, k, v, causal=True)"
EARLIER = "out, lse = merge(out, lse, *attend(q, k, v, causal=False))"
SOURCE = "source = (rank - step) % n"
# slip -> (substitutions on the solution's lab13_ring.py, the words its FAIL line must hold).
SLIPS = {
    "average": ([(MERGED, "return (out_a + out_b) / 2, lse")], "the output: it averages the two outputs"),
    "sum": ([(MERGED, "return out_a + out_b, lse")], "the output: it adds the two outputs"),
    "lse_kept": ([(MERGED, "return weight_a * out_a + weight_b * out_b, lse_a")], "the lse: it is lse_a unchanged"),
    "lse_not_carried": (
        [(EARLIER, EARLIER.replace("out, lse =", "out, _ ="))],
        "a merge does not get the previous merge's result",
    ),
    "start_from_zeros": (
        [(OWN, "out, lse = merge(torch.zeros_like(q), torch.zeros(q.shape[:-1]), *attend(q, k, v, causal=True))")],
        "first merge starts from out = 0, lse = 0",
    ),
    "own_block_full": ([(OWN, OWN.replace("True", "False"))], "attended to its own block without the causal mask"),
    "earlier_causal": ([(EARLIER, EARLIER.replace("False", "True"))], "an earlier one, with the causal mask"),
    "later_not_skipped": ([("if source < rank:", "if source != rank:")], "a later one (full mask)"),
    "source_plus_one": ([(SOURCE, "source = (rank - step + 1) % n")], "as if its source were (rank - step + 1) % N"),
    "source_minus_one": ([(SOURCE, "source = (rank - step - 1) % n")], "as if its source were (rank - step - 1) % N"),
    "sent_left": (
        [("right, left = (rank + 1) % n, (rank - 1) % n", "right, left = (rank - 1) % n, (rank + 1) % n")],
        "K/V travel the wrong way round",
    ),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Per slip: the checker's main() on the variant: {"code", "output", "error"}."""
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab13"))
    names = write_variants(folder, "lab13_ring", {name: subs for name, (subs, _) in SLIPS.items()})
    command = job_command(DRIVER, WORLD_SIZE, folder / "lab13_check.py", "lab13_ring", *names)
    result = launch(command, cwd=folder, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"variant"')]
    return {record.pop("variant")[len("lab13_ring_") :]: record for record in records}


@pytest.mark.parametrize("slip", SLIPS)
def test_the_fail_line_names_the_slip(checked, slip):
    assert slip in checked, f"no verdict for {slip}: {sorted(checked)}"
    assert_fail_names(checked[slip], SLIPS[slip][1])
