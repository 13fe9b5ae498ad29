"""Lab 13's checker names the likely slips of ring attention, and the answers that skip the ring: each
injected into the solution's lab13_ring.py, every variant checked by the checker's own main() in one
torchrun of 4 ranks (tests/slip_driver.py), the world size the lab checks at. A ring that waits
forever (a rank leaving the ring early, blocking sends), a collective, a receive into the tensor
being sent and the course's own ring are named by the run on threads that comes first, at once.
The merge's in-kernel check and its slips: tests/course/test_slips_lab13_merge.py; the recognisers
on traces of 3 ranks: tests/unit/test_slips_ring_attention.py."""

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
NEW_TENSORS = "k_in, v_in = torch.empty_like(k), torch.empty_like(v)"
BATCHED = """    ops = [
        dist.P2POp(dist.isend, k, right),
        dist.P2POp(dist.isend, v, right),
        dist.P2POp(dist.irecv, k_in, left),
        dist.P2POp(dist.irecv, v_in, left),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
"""
LOOP = "for step in range(1, n):"
THREADS = "FAIL your ring on 4 threads: "
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
    # The ring left once the blocks that arrive are later ones: rank 0 leaves at once.
    "leaves_the_ring_early": (
        [(LOOP, "for step in range(1, rank + 1):")],
        THREADS + "the ring waits forever (rank 0 returned after 0 send(s) and 0 receive(s); rank 1 waits for its "
        "receive #1 from rank 0; ",
    ),
    "blocking_send_then_receive": (
        [
            (
                BATCHED,
                "    dist.send(k, right)\n    dist.send(v, right)\n"
                "    dist.recv(k_in, left)\n    dist.recv(v_in, left)\n",
            )
        ],
        "every rank waits in a blocking send to a neighbour that is sending too: post the sends and the receives "
        "together, in one dist.batch_isend_irecv",
    ),
    "received_into_the_tensor_sent": (
        [(NEW_TENSORS, "k_in, v_in = k, v")],
        THREADS + "rank 0 receives into a tensor it is still sending (its receive #1)",
    ),
    # The ring skipped: every block gathered at once.
    "all_gather": (
        [
            (
                LOOP,
                "blocks = [torch.empty_like(k) for _ in range(n)]\n"
                "    dist.all_gather(blocks, k)\n"
                "    values = [torch.empty_like(v) for _ in range(n)]\n"
                "    dist.all_gather(values, v)\n"
                "    for source in range(rank):\n"
                "        out, lse = merge(out, lse, *attend(q, blocks[source], values[source], causal=False))\n"
                "    return out, lse\n"
                "    " + LOOP,
            )
        ],
        THREADS + "ring_attention calls dist.all_gather: the keys and values go round the ring",
    ),
    # The ring skipped: the course's own.
    "the_course_ring": (
        [(BATCHED, "    from parallel_course.context_parallel import shift\n\n    k_in, v_in = shift(k), shift(v)\n")],
        THREADS + "ring_attention calls the course's parallel_course.context_parallel (shift)",
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
