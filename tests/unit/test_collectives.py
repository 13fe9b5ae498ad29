"""The chapter-03 simulations: correct sums, the right messages, the right byte counts."""

import pytest
import torch

from parallel_course import collectives as c


@pytest.mark.parametrize("length,n", [(7, 3), (6, 3), (1, 4), (0, 2), (1001, 4), (5, 1)])
def test_chunk_bounds_match_tensor_split(length, n):
    x = torch.arange(length)
    expected = [(int(p[0]), int(p[-1]) + 1) if len(p) else None for p in x.tensor_split(n)]
    bounds = c.chunk_bounds(length, n)
    assert len(bounds) == n
    assert [hi - lo for lo, hi in bounds] == [len(p) for p in x.tensor_split(n)]
    assert all(e is None or e == b for e, b in zip(expected, bounds))
    assert bounds[0][0] == 0 and bounds[-1][1] == length


def test_chunk_bounds_rejects_bad_input():
    with pytest.raises(ValueError):
        c.chunk_bounds(5, 0)
    with pytest.raises(ValueError):
        c.chunk_bounds(-1, 2)


@pytest.mark.parametrize("simulate", [c.ring_allreduce, c.naive_ring_allreduce])
@pytest.mark.parametrize("n,length", [(1, 5), (2, 4), (3, 7), (4, 2), (5, 1001), (8, 64)])
def test_every_rank_gets_the_sum(simulate, n, length):
    g = torch.Generator().manual_seed(n * 1000 + length)
    tensors = [torch.randn(length, generator=g) for _ in range(n)]
    before = [t.clone() for t in tensors]
    trace = simulate(tensors)
    total = torch.stack(tensors).sum(0)
    for r in range(n):
        torch.testing.assert_close(trace.results[r], total, atol=1e-5, rtol=0)
        assert torch.equal(tensors[r], before[r])  # inputs untouched
    # after the last step every rank holds every rank's contribution everywhere
    assert all(cell == frozenset(range(n)) for row in trace.states[-1] for cell in row)


def test_keeps_shape():
    tensors = [torch.ones(2, 3) * r for r in range(3)]
    assert c.ring_allreduce(tensors).results[0].shape == (2, 3)


def test_ring_messages_follow_the_schedule():
    trace = c.ring_allreduce([torch.zeros(6) for _ in range(3)])
    assert len(trace.messages) == 2 * 2 * 3  # 2(N-1) steps, N messages each
    assert len(trace.steps()) == 4 and len(trace.states) == 5
    first = trace.steps()[0]
    assert [(m.src, m.dst, m.chunk) for m in first] == [(0, 1, 0), (1, 2, 1), (2, 0, 2)]
    # after reduce-scatter, rank r owns the full sum of chunk (r + 1) % N
    after_rs = trace.states[2]
    for r in range(3):
        assert after_rs[r][(r + 1) % 3] == frozenset({0, 1, 2})
    assert c.state_table(trace, 1)[1] == ["0+1", "1", "1"]
    assert "rank 0 -> rank 1: chunk 0 (8 bytes)" in c.describe_step(trace, 0)


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_bytes_are_2_n_minus_1_over_n(n):
    numel = 840  # divisible by 1..8
    sent = c.ring_allreduce([torch.zeros(numel) for _ in range(n)]).bytes_sent()
    assert sent == c.ring_bytes_per_rank(n, numel) == [2 * (n - 1) * numel * 4 // n] * n
    naive = c.naive_ring_allreduce([torch.zeros(numel) for _ in range(n)]).bytes_sent()
    assert naive == c.naive_bytes_per_rank(n, numel) == [(n - 1) * numel * 4] * n


@pytest.mark.parametrize("n,numel", [(3, 7), (4, 1001), (4, 1), (3, 2)])
def test_uneven_byte_counts_agree(n, numel):
    trace = c.ring_allreduce([torch.zeros(numel, dtype=torch.float64) for _ in range(n)])
    assert trace.bytes_sent() == c.ring_bytes_per_rank(n, numel, itemsize=8)
    assert sum(trace.bytes_sent()) == sum(trace.bytes_received())


def test_rejects_mismatched_tensors():
    with pytest.raises(ValueError, match="same shape"):
        c.ring_allreduce([torch.zeros(3), torch.zeros(4)])
    with pytest.raises(ValueError):
        c.ring_allreduce([])
