"""Pipeline schedules as data, the bubble formula, and naive model parallelism (chapter 07a)."""

import pytest
import torch
import torch.nn as nn

from parallel_course import model_parallel as pipe


@pytest.mark.parametrize("kind", pipe.KINDS)
@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 1), (2, 4), (3, 2), (4, 8), (4, 3), (8, 16)])
def test_idle_fraction_is_the_bubble_formula(kind, p, m):
    for t_b in (1, 2):  # also with a backward twice as long as a forward
        ops = pipe.schedule(kind, p, m, t_forward=1, t_backward=t_b)
        assert len(ops) == 2 * p * m
        assert pipe.makespan(ops) == (m + p - 1) * (1 + t_b)
        assert pipe.idle_fraction(ops) == pytest.approx(pipe.bubble_fraction(p, m))


def test_timeline_respects_dependencies():
    ops = pipe.schedule("1f1b", 4, 6)
    end = {(op.kind, op.stage, op.microbatch): op.slot + op.duration for op in ops}
    for op in ops:
        if op.kind == "F" and op.stage > 0:
            assert op.slot >= end[("F", op.stage - 1, op.microbatch)]
        if op.kind == "B" and op.stage < 3:
            assert op.slot >= end[("B", op.stage + 1, op.microbatch)]
    for s in range(4):  # one operation at a time per stage
        mine = sorted((op.slot, op.slot + op.duration) for op in ops if op.stage == s)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))


def test_one_f_one_b_order_and_peaks():
    assert pipe.one_f_one_b_orders(2, 3) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)],
    ]
    assert pipe.peak_activations("gpipe", 4, 8) == [8, 8, 8, 8]
    assert pipe.peak_activations("1f1b", 4, 8) == [4, 3, 2, 1]
    assert pipe.peak_activations("1f1b", 4, 2) == [2, 2, 2, 1]


@pytest.mark.parametrize("p", range(1, 9))
def test_peaks_per_stage_and_when_1f1b_holds_as_much_as_gpipe(p):
    for m in range(1, 3 * p + 2):
        assert pipe.peak_activations("gpipe", p, m) == [m] * p
        assert pipe.peak_activations("1f1b", p, m) == [min(p - s, m) for s in range(p)]
        # chapter 07: 1F1B's peak (stage 0) equals GPipe's exactly when m <= p
        assert (max(pipe.peak_activations("1f1b", p, m)) == m) == (m <= p)


def test_a_bubble_under_ten_percent_needs_m_above_9_times_p_minus_1():
    # chapter 07: (p-1)/(m+p-1) < 0.1 <=> m > 9(p-1); 8 stages need m >= 64, m = 63 gives 10 %
    assert pipe.bubble_fraction(8, 63) == pytest.approx(0.1)
    assert pipe.bubble_fraction(8, 64) < 0.1
    for p in range(2, 9):
        assert min(m for m in range(1, 1000) if pipe.bubble_fraction(p, m) < 0.1) == 9 * (p - 1) + 1


def test_grid():
    rows = pipe.grid(pipe.schedule("gpipe", 2, 2))
    assert rows == [["F0", "F1", "", "", "B0", "B1"], ["", "F0", "F1", "B0", "B1", ""]]


def test_bad_orders_are_refused():
    with pytest.raises(ValueError, match="deadlock"):
        pipe.timeline([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]])
    with pytest.raises(ValueError, match="once each"):
        pipe.timeline([[("F", 0), ("B", 0)], [("F", 0)]])
    with pytest.raises(ValueError, match="before"):
        pipe.validate_orders([[("B", 0), ("F", 0)]])
    with pytest.raises(ValueError):
        pipe.stage_orders("zero-bubble", 2, 2)
    with pytest.raises(ValueError):
        pipe.bubble_fraction(0, 4)


def test_measured_idle_fraction():
    busy = [[(0.0, 1.0, "F0"), (2.0, 3.0, "B0")], [(1.0, 2.0, "F0")]]
    assert pipe.measured_idle_fraction(busy) == pytest.approx(0.5)


def test_split_sequential_balances_parameters_and_keeps_the_function():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    stages = pipe.split_sequential(model, 2)
    assert [len(s) for s in stages] == [4, 1]
    assert [len(s) for s in pipe.split_sequential(model, 5)] == [1, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        pipe.split_sequential(model, 6)
    split = pipe.SplitModel(stages, pipe.stage_devices(2))
    x = torch.randn(4, 8)
    assert torch.allclose(split(x).cpu(), model.cpu()(x))
    assert pipe.parameter_bytes(model) == sum(pipe.parameter_bytes(s) for s in stages)


def test_one_f_one_b_is_its_closed_form():
    """The package derives 1F1B from its memory rule (at most p - s micro-batches on stage s), and the
    chapter's executor runs its orders. They equal the closed form: p - 1 - s warm-up forwards, then
    one forward and one backward in turn, then the remaining backwards."""
    for p in range(1, 9):
        for m in range(1, 17):
            closed = []
            for s in range(p):
                w = min(p - 1 - s, m)
                steady = [op for i in range(m - w) for op in (("F", w + i), ("B", i))]
                closed.append([("F", i) for i in range(w)] + steady + [("B", i) for i in range(m - w, m)])
            assert pipe.one_f_one_b_orders(p, m) == closed, (p, m)
