"""parallel_course.input_pipeline_figures (chapter 11b): which samples each rank and worker read,
and each timed step's wait and compute on a timeline."""

import torch
from torch.utils.data import DataLoader, DistributedSampler

from parallel_course import input_pipeline_figures as ipf
from parallel_course.input_pipeline import NoisyCopies, SeededNoisyCopies


def draw(dataset, rank, world_size=2):
    # What chapter 11b's draw() returns, in the main process: index -> (noise, worker), in order.
    torch.manual_seed(0)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    return {
        i: (n, w) for index, noise, worker in loader for i, n, w in zip(index.tolist(), noise.tolist(), worker.tolist())
    }


def test_a_box_per_sample_in_the_order_read_by_batch():
    draws = [draw(SeededNoisyCopies(16, seed=0), rank) for rank in (0, 1)]
    rows = ipf.sample_rows(draws, batch_size=4)
    for row, d in zip(rows, draws):
        assert [b.index for b in row] == list(d)
        assert [b.batch for b in row] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert {b.worker for b in row} == {-1}
    # Seeded per sample: no rank draws another's noise.
    assert not any(b.shared for row in rows for b in row)


def test_the_same_noise_on_two_ranks_is_marked():
    draws = [draw(NoisyCopies(16), rank) for rank in (0, 1)]
    rows = ipf.sample_rows(draws, batch_size=4)
    assert all(b.shared for row in rows for b in row)
    assert set(draws[0]).isdisjoint(draws[1])
    alt = ipf.describe_samples([("shared", rows)])
    assert "8 of its 8 noises also drawn by another rank" in alt


def test_workers_are_read_from_the_loader():
    draws = [{3: (0.1, 0), 5: (0.2, 0), 1: (0.3, 1), 7: (0.4, 1)}]
    rows = ipf.sample_rows(draws, batch_size=2)
    assert [(b.index, b.batch, b.worker) for b in rows[0]] == [(3, 0, 0), (5, 0, 0), (1, 1, 1), (7, 1, 1)]
    fig = ipf.samples_figure([("t", rows)])
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == 4


def test_the_timeline_puts_each_steps_wait_then_its_compute_end_to_end():
    segments = ipf.timeline([(0.03, 0.01), (0.02, 0.005)])
    assert [(s.step, s.kind) for s in segments] == [(0, "wait"), (0, "compute"), (1, "wait"), (1, "compute")]
    assert [round(s.start, 6) for s in segments] == [0.0, 0.03, 0.04, 0.06]
    assert [s.length for s in segments] == [0.03, 0.01, 0.02, 0.005]
    runs = {"num_workers=0": segments, "num_workers=2": ipf.timeline([(0.0, 0.01)])}
    assert "num_workers=0: 2 steps in 65 ms, 50 ms of it waiting" in ipf.describe_timelines(runs)
    # What nbval compares does not depend on the times measured.
    other = {name: ipf.timeline([(1.0, 2.0)]) for name in runs}
    assert ipf.plain_timelines(runs) == ipf.plain_timelines(other)
    assert ipf.describe_timelines(runs) != ipf.describe_timelines(other)
    fig = ipf.timeline_figure(runs)
    assert len(fig.axes) == 1
