"""parallel_course.long_sequence_figures (chapter 13a): the ring's steps as cp.ring_attention runs
them on simulated ranks, turned into what is drawn where."""

from unittest import mock

import pytest

from parallel_course import context_parallel as cp
from parallel_course import long_sequence_figures as lsf


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_each_rank_holds_the_block_of_rank_r_minus_s_at_step_s(layout):
    n = 4
    steps = lsf.ring_steps(lsf.record_ring(n, layout, seq_len=32))
    for rank, row in enumerate(steps):
        assert [s.source for s in row] == [(rank - step) % n for step in range(n)]
        assert [s.key_chunks for s in row] == [cp.chunks_of((rank - step) % n, n, layout) for step in range(n)]
        # Over the ring every rank meets every key chunk once.
        assert sorted(k for s in row for k in s.key_chunks) == list(range(cp.chunk_count(n, layout)))


@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_the_squares_drawn_are_the_pairs_the_ring_computed(layout):
    n = 4
    steps = lsf.ring_steps(lsf.record_ring(n, layout, seq_len=32))
    for row in steps:
        for s in row:
            mine = cp.chunks_of(s.rank, n, layout)
            assert set(s.pairs) == {(q, k) for q in mine for k in s.key_chunks}
            assert all(kind == cp.mask_kind(q, k) for (q, k), kind in s.pairs.items())
    assert lsf.pairs_computed(steps, 32, layout) == cp.pairs_per_rank(32, n, layout)


def test_the_record_is_what_the_ring_did_not_what_it_should_do():
    # Negative control: a ring that computed its diagonal blocks without their causal mask is
    # recorded, and drawn, as such; the count of pairs then differs from pairs_per_rank.
    real = cp.mask_kind
    with mock.patch.object(cp, "mask_kind", lambda q, k: "full" if k <= q else real(q, k)):
        wrong = lsf.ring_steps(lsf.record_ring(3, "contiguous", seq_len=6))
    assert wrong[0][0].pairs[(0, 0)] == "full"
    assert lsf.pairs_computed(wrong, 6, "contiguous") != cp.pairs_per_rank(6, 3, "contiguous")


def test_figure_and_text_alternative():
    record = lsf.record_ring(2, "zigzag", seq_len=8)
    fig = lsf.ring_figure(record)
    assert len(fig.axes) == 2
    # Per rank and step: a band, and a square per (query chunk, key chunk) pair (2 x 2 with zig-zag),
    # filled over for every pair computed (full or diagonal).
    computed = sum(kind != "skip" for row in lsf.ring_steps(record) for s in row for kind in s.pairs.values())
    assert len(fig.axes[1].patches) == 2 * 2 * (1 + 4) + computed
    alt = lsf.describe_ring(record)
    assert "zigzag split of 8 positions into 4 chunks" in alt
    assert "Rank 1: step 0: K/V of rank 1" in alt and "step 1: K/V of rank 0" in alt
