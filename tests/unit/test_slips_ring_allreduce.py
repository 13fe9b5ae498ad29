"""Lab 03's slips, recognised from how many times each rank's input makes up each chunk of a result.

The results are made here from such counts, per rank and chunk: the patterns a ring with each slip
leaves at 3 and 4 ranks, where the lab checks too (the launch test injects the slips into a real
ring at 2: tests/launches/test_slips_lab03.py). A send or receive that times out: the launch finds
every deadlock on threads first, so only here."""

import pytest
import torch

from parallel_course.slips.ring_allreduce import chunk_counts, ring_slip, timeout_slip


def inputs(n, length=1001):
    g = torch.Generator().manual_seed(n)
    return [torch.randn(length, generator=g) for _ in range(n)]


def results(xs, counts):
    """counts[r][j][q]: how many times rank q's input makes up chunk j of rank r's result."""
    n = len(xs)
    pieces = [x.tensor_split(n) for x in xs]
    return [torch.cat([sum(c * pieces[q][j] for q, c in enumerate(row[j])) for j in range(n)]) for row in counts]


def every_rank(n, chunk):
    """The same counts on every rank: chunk(j) -> the counts of chunk j."""
    return [[chunk(j) for j in range(n)] for _ in range(n)]


def one_hot(n, q):
    return [1 if i == q else 0 for i in range(n)]


def test_the_counts_of_a_right_sum_are_all_ones():
    xs = inputs(3)
    total = sum(xs)
    assert chunk_counts(xs, [total] * 3) == [[(1.0, 1.0, 1.0)] * 3] * 3
    assert ring_slip(xs, [total] * 3) is None


def test_no_counts_where_a_chunk_is_no_such_sum_or_too_short():
    xs = inputs(3)
    assert chunk_counts(xs, [torch.randn(1001)] * 3) is None
    short = inputs(3, length=7)
    assert chunk_counts(short, [sum(short)] * 3) is None
    assert ring_slip(xs, [torch.randn(1001)] * 3) is None


@pytest.mark.parametrize("n", [3, 4])
def test_overwrite_in_the_reduce_scatter(n):
    xs = inputs(n)
    got = results(xs, every_rank(n, lambda j: one_hot(n, j)))
    assert "chunk j those of rank j, not the sum: does the reduce-scatter overwrite" in ring_slip(xs, got)


@pytest.mark.parametrize("n", [3, 4])
def test_chunks_never_summed(n):
    # a reduce-scatter a step short, or sending another chunk than the plan's: chunk j is rank j-1's
    xs = inputs(n)
    got = results(xs, every_rank(n, lambda j: one_hot(n, (j - 1) % n)))
    assert "the all-gather spreads chunks the reduce-scatter never summed" in ring_slip(xs, got)


@pytest.mark.parametrize("n", [3, 4])
def test_an_all_gather_a_step_short(n):
    # on rank r, chunk r + 2 still holds the reduce-scatter's partial sum, which lacks rank r + 1
    xs = inputs(n)

    def partial(r, j):
        return [0 if (j == (r + 2) % n and q == (r + 1) % n) else 1 for q in range(n)]

    counts = [[partial(r, j) for j in range(n)] for r in range(n)]
    assert "one chunk holds a partial sum and the others the full sum" in ring_slip(xs, results(xs, counts))


def test_an_all_gather_that_adds():
    xs = inputs(3)
    counts = every_rank(3, lambda j: [2, 1, 1] if j == 0 else [1, 1, 1])
    assert "count a rank's values twice or more: does the all-gather add" in ring_slip(xs, results(xs, counts))


@pytest.mark.parametrize("n", [3, 4])
def test_the_average_and_the_unchanged_tensor(n):
    xs = inputs(n)
    assert f"every element is 1/{n} of the sum" in ring_slip(xs, [sum(xs) / n] * n)
    assert "every rank's tensor still holds its own values" in ring_slip(xs, [x.clone() for x in xs])


def test_a_timeout_is_a_deadlock_and_nothing_else_is():
    assert "does every rank wait in a blocking send" in timeout_slip(
        RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 3000ms for send operation")
    )
    assert timeout_slip(RuntimeError("The size of tensor a (3) must match the size of tensor b (2)")) is None
