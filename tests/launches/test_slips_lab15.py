"""Lab 15's launched checker names the slips injected into the solution's lab15_norm.py on real process
groups: every variant checked by the checker's own main() in one torchrun of 4 ranks (dp 1 × tp 2 × pp 2,
tests/slip_driver.py), the world size the lab launches. Its run on threads comes first and names a rank
that leaves the others waiting at once; the other slips reach the real groups (gloo here, nccl on GPUs),
where the collectives are torch's and their elements are counted by wrapping them. Every slip in the
kernel, with the 12-rank layout: tests/course/test_slips_lab15_checks.py."""

import json

import pytest

from helpers import job_command, launch
from lab15_edits import DP, GRADIENTS_GATHERED, OWN_TEST, PP, SKIP
from slip_injection import DRIVER, assert_fail_names, lab_folder, write_variants

SOLUTION = "lab15_global_norm.ipynb"
WORLD_SIZE = 4
REAL = "FAIL global_norm on 4 ranks (dp 1 × tp 2 × pp 2), one training step's gradient: "
NORM = "    norm = global_norm(pieces, layout)\n    # The same norm on every rank: every rank decides alike.\n"
# slip -> (substitutions on the solution's lab15_norm.py, the words its FAIL line must hold).
SLIPS = {
    "stages_never_reduced": ([(PP, "")], REAL + "expected torch's norm"),
    "experts_counted_on_every_rank": (
        [(DP, DP.replace(", group=layout.dp.group", ""))],
        "experts counted on every rank: each expert was counted 4 times",
    ),
    "gradients_gathered": (GRADIENTS_GATHERED, "FAIL global_norm's collectives: a rank gave them"),
    "clipped_with_the_local_norm": (
        [
            (
                "    norm = global_norm(pieces, layout)\n",
                "    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in pieces))\n",
            )
        ],
        "clipped with each rank's local norm",
    ),
    "leaves_before_the_norm": (
        [(NORM + SKIP, OWN_TEST + NORM)],
        "FAIL your code on 4 threads: clip_, an inf in expert 5 (held by dp rank 0): the ranks wait forever "
        "(rank 2 returned after 0 collective call(s); rank 3 returned after 0 collective call(s);",
    ),
}
ALSO = {"stages_never_reduced": "stages never reduced", "gradients_gathered": "the norm needs only sums of squares"}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Per slip: the checker's main() on the variant: {"code", "output", "error"}."""
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab15"))
    names = write_variants(folder, "lab15_norm", {name: subs for name, (subs, _) in SLIPS.items()})
    command = job_command(DRIVER, WORLD_SIZE, folder / "lab15_check.py", "lab15_norm", *names)
    result = launch(command, cwd=folder, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"variant"')]
    return {record.pop("variant")[len("lab15_norm_") :]: record for record in records}


@pytest.mark.parametrize("slip", SLIPS)
def test_the_fail_line_names_the_slip(checked, slip):
    assert slip in checked, f"no verdict for {slip}: {sorted(checked)}"
    assert_fail_names(checked[slip], SLIPS[slip][1], ALSO.get(slip, ""))
