"""Lab 03's checker names the likely slips of a ring all-reduce, and the answers that skip the ring:
each injected into the solution's ring, every variant checked by the checker's own main() in one
launch of 2 ranks (tests/slip_driver.py). The checker first runs the ring on threads (3 and 4 of
them too): a deadlock, a collective, a send past the right neighbour or the whole tensor sent are
named there, at once; the values' patterns of more ranks: tests/unit/test_slips_ring_allreduce.py."""

import re

import pytest

from slip_injection import check_variants, fail_lines, lab_folder

SOLUTION = "lab03_ring_allreduce.ipynb"
EXCHANGE = (
    "        if rank % 2 == 0:\n"
    "            dist.send(outgoing, dst=right)\n"
    "            dist.recv(incoming, src=left)\n"
    "        else:\n"
    "            dist.recv(incoming, src=left)\n"
    "            dist.send(outgoing, dst=right)\n"
)
REDUCE_SCATTER = "    # Reduce-scatter.\n"
RETURN = "    return tensor\n"
# slip -> (substitutions on the solution's lab03_ring.py, the words its FAIL line(s) must hold).
SLIPS = {
    "overwrite in the reduce-scatter": (
        [("mine.add_(incoming)", "mine.copy_(incoming)")],
        "chunk j those of rank j, not the sum: does the reduce-scatter overwrite what it receives",
    ),
    "a reduce-scatter a step short": (
        [("    for s in range(n - 1):\n        mine = ", "    for s in range(n - 2):\n        mine = ")],
        "the all-gather spreads chunks the reduce-scatter never summed",
    ),
    "an all-gather a step short": (
        [
            (
                "    for s in range(n - 1):\n        exchange(chunks[(rank + 1 - s) % n]",
                "    for s in range(n - 2):\n        exchange(chunks[(rank + 1 - s) % n]",
            )
        ],
        "one chunk holds a partial sum and the others the full sum: does the all-gather run all N - 1 steps?",
    ),
    "an all-gather that adds": (
        [
            (
                "        exchange(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])\n",
                "        incoming = torch.empty_like(chunks[(rank - s) % n])\n"
                "        exchange(chunks[(rank + 1 - s) % n], incoming)\n"
                "        chunks[(rank - s) % n].add_(incoming)\n",
            )
        ],
        "some chunks count a rank's values twice or more: does the all-gather add what it receives",
    ),
    "the average, not the sum": (
        [("chunks[(rank - s) % n])\n    return tensor\n", "chunks[(rank - s) % n])\n    return tensor.div_(n)\n")],
        "every element is 1/2 of the sum: is the sum divided by the world size?",
    ),
    "not in place": (
        [("chunks = tensor.view(-1).tensor_split(n)", "chunks = tensor.flatten().clone().tensor_split(n)")],
        "every rank's tensor still holds its own values: is the sum written into the tensor it was given",
    ),
    # Every rank sends first: found on threads, at once, not after a timeout.
    "deadlock": (
        [(EXCHANGE, "        dist.send(outgoing, dst=right)\n        dist.recv(incoming, src=left)\n")],
        "FAIL your ring on 2 threads: the ring deadlocks (rank 0 waits in its send #1 to rank 1; rank 1 waits in "
        "its send #1 to rank 0): every rank waits in a blocking send for a neighbour that is sending too",
    ),
    # The ring skipped: a collective does the work.
    "all_gather": (
        [
            (
                REDUCE_SCATTER,
                "    parts = [torch.empty_like(tensor) for _ in range(n)]\n"
                "    dist.all_gather(parts, tensor)\n"
                "    return tensor.copy_(sum(parts))\n" + REDUCE_SCATTER,
            )
        ],
        "FAIL your ring on 2 threads: ring_allreduce calls dist.all_gather: the ring is built from blocking dist.send "
        "and dist.recv only",
    ),
    # The ring skipped: the whole tensor passed round, each rank adding what arrives (N - 1 whole tensors).
    "the whole tensor round the ring": (
        [
            (
                REDUCE_SCATTER,
                "    total, passing = tensor.clone(), tensor.clone()\n"
                "    for s in range(n - 1):\n"
                "        incoming = torch.empty_like(passing)\n"
                "        exchange(passing, incoming)\n"
                "        total += incoming\n"
                "        passing = incoming\n"
                "    return tensor.copy_(total)\n" + REDUCE_SCATTER,
            )
        ],
        "FAIL your ring on 3 threads: for a tensor of 1,001 elements rank 0 sends 2,002 elements (2.00x the "
        "tensor): a ring sends 2(N - 1) chunks of about 1/N of it, 1,336 elements at most",
    ),
    # The ring skipped: every rank sends its whole tensor to every other rank.
    "the whole tensor to every rank": (
        [
            (
                REDUCE_SCATTER,
                "    total = tensor.clone()\n"
                "    for other in range(n):\n"
                "        if other == rank:\n"
                "            continue\n"
                "        incoming = torch.empty_like(tensor)\n"
                "        if rank < other:\n"
                "            dist.send(tensor, dst=other)\n"
                "            dist.recv(incoming, src=other)\n"
                "        else:\n"
                "            dist.recv(incoming, src=other)\n"
                "            dist.send(tensor, dst=other)\n"
                "        total += incoming\n"
                "    return tensor.copy_(total)\n" + REDUCE_SCATTER,
            )
        ],
        "FAIL your ring on 3 threads: for a tensor of 1,001 elements rank 0 sends to rank(s) 1, 2 and sends 2,002 "
        "elements (2.00x the tensor)",
    ),
}
# Found on threads: the checker's one FAIL line.
ON_THREADS = {"deadlock", "all_gather", "the whole tensor round the ring", "the whole tensor to every rank"}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    folder = lab_folder(SOLUTION, tmp_path_factory.mktemp("lab03"))
    slips = {re.sub(r"\W+", "_", name): substitutions for name, (substitutions, _) in SLIPS.items()}
    return check_variants(folder, "lab03_check.py", "lab03_ring", slips)


@pytest.mark.parametrize("slip", SLIPS)
def test_the_checker_names_the_slip(checked, slip):
    record = checked[re.sub(r"\W+", "_", slip)]
    assert record["error"] is None and record["code"] == 1, record
    failures, named = fail_lines(record), SLIPS[slip][1]
    if slip in ON_THREADS:
        assert len(failures) == 1 and named in failures[0], record["output"]
    else:
        # every case long enough to tell (more elements per chunk than ranks) names it
        told = [line for line in failures if re.search(r"length=(7|1000|1001|21)\b", line)]
        assert len(told) == 4 and all(named in line for line in told), record["output"]
