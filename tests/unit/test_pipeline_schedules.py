"""Interleaved 1F1B and ZB-H1 as data (chapter 07a): their orders, timelines and bubble formulas."""

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from parallel_course import model_parallel as pipe
from parallel_course.explorers.pipeline import KEY, describe_measured, describe_timelines, draw_timeline

# Every m that is a multiple of p, up to 4p, for p <= 6 and v <= 4 chunks per device.
MULTIPLES = [(p, m, v) for p in range(1, 7) for m in range(p, 4 * p + 1, p) for v in range(1, 5)]
ZB_CASES = [(p, m) for p in range(1, 9) for m in range(1, 25)]


def _ends(ops):
    """(kind, virtual stage, micro-batch) -> end time, the virtual stage being chunk * p + device."""
    p = max(op.stage for op in ops) + 1
    return {(op.kind, op.chunk * p + op.stage, op.microbatch): op.slot + op.duration for op in ops}


def _one_at_a_time(ops):
    for s in {op.stage for op in ops}:
        mine = sorted((op.slot, op.slot + op.duration) for op in ops if op.stage == s)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))


# --- interleaved 1F1B -----------------------------------------------------------------------


@pytest.mark.parametrize("t_b", [1, 2])
def test_interleaved_idle_fraction_is_p_minus_1_over_vm_plus_p_minus_1(t_b):
    for p, m, v in MULTIPLES:
        ops = pipe.schedule("interleaved", p, m, t_backward=t_b, n_chunks=v)
        assert len(ops) == 2 * p * m * v
        assert pipe.idle_fraction(ops) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12), (p, m, v)
        # in a chunk's slots: work 2vm (or 3vm), bubble (p - 1) chunk forward + backward
        assert pipe.makespan(ops) == (v * m + p - 1) * (1 + t_b)


def test_interleaved_with_chunks_of_a_stage_is_the_same_fraction():
    """Chunks 1/v of a stage (t_forward = 1/v) change the time unit, not the idle fraction."""
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 6, 3)]:
        ops = pipe.schedule("interleaved", p, m, t_forward=1 / v, t_backward=2 / v, n_chunks=v)
        assert pipe.makespan(ops) == pytest.approx(3 * m + 3 * (p - 1) / v)
        assert pipe.idle_fraction(ops) == pytest.approx((p - 1) / (v * m + p - 1))


def test_interleaved_orders_follow_megatrons_rules():
    p, m, v = 2, 4, 2
    orders = pipe.interleaved_orders(p, m, v)
    forwards = [op for op in orders[0] if op[0] == "F"]
    # groups of p micro-batches, chunk after chunk
    assert forwards == [("F", i, c) for g in (0, 2) for c in (0, 1) for i in (g, g + 1)]
    backwards = [op for op in orders[0] if op[0] == "B"]
    assert backwards == [("B", i, c) for g in (0, 2) for c in (1, 0) for i in (g, g + 1)]
    # warm-up (v - 1) p + 2 (p - 1 - d): 4 on device 0, 2 on device 1, then F and B in turn
    assert [op[0] for op in orders[0]] == ["F"] * 4 + ["F", "B"] * 4 + ["B"] * 4
    assert [op[0] for op in orders[1]] == ["F"] * 2 + ["F", "B"] * 6 + ["B"] * 2
    pipe.validate_orders(orders)


def test_interleaved_timeline_respects_dependencies_across_devices():
    for p, m, v in [(2, 4, 2), (3, 6, 2), (4, 8, 3)]:
        ops = pipe.schedule("interleaved", p, m, n_chunks=v)
        end = _ends(ops)
        last = p * v - 1
        for op in ops:
            virtual = op.chunk * p + op.stage
            if op.kind == "F" and virtual > 0:
                # chunk c on device 0 waits for chunk c - 1 on the last device
                assert op.slot >= end[("F", virtual - 1, op.microbatch)]
            if op.kind == "B":
                dep = ("B", virtual + 1, op.microbatch) if virtual < last else ("F", virtual, op.microbatch)
                assert op.slot >= end[dep]
        _one_at_a_time(ops)


def test_interleaved_activations_held():
    """Device d holds at most (v - 1) p + 2 (p - 1 - d) + 1 (micro-batch, chunk) pairs, each 1/v of
    a stage's: p + (p - 1)/v micro-batches' worth on device 0 when v m allows it (1F1B: p)."""
    for p, m, v in MULTIPLES:
        held = pipe.peak_activations("interleaved", p, m, n_chunks=v)
        assert held == [min((v - 1) * p + 2 * (p - 1 - d) + 1, v * m) for d in range(p)], (p, m, v)
    p, m, v = 4, 16, 2
    assert pipe.peak_activations("interleaved", p, m, n_chunks=v)[0] / v == p + (p - 1) / v


def test_interleaved_refuses_what_its_rules_cannot_schedule():
    with pytest.raises(ValueError, match="multiple of p"):
        pipe.interleaved_orders(4, 6, 2)
    with pytest.raises(ValueError):
        pipe.interleaved_orders(2, 4, 0)


# --- ZB-H1 ------------------------------------------------------------------------------------


def test_zb_h1_step_is_3m_plus_p_minus_1_slots():
    for p, m in ZB_CASES:
        ops = pipe.schedule("zb-h1", p, m)
        assert len(ops) == 3 * p * m
        assert pipe.makespan(ops) == 3 * m + p - 1 + max(p - m, 0), (p, m)
        if m >= p:
            assert pipe.idle_fraction(ops) == pytest.approx((p - 1) / (3 * m + p - 1))


def test_zb_h1_bubble_is_a_third_of_1f1bs():
    for p, m in ZB_CASES:
        if m >= p:
            zb = pipe.makespan(pipe.schedule("zb-h1", p, m)) - 3 * m
            one_f_one_b = pipe.makespan(pipe.schedule("1f1b", p, m, t_backward=2)) - 3 * m
            assert 3 * zb == one_f_one_b == 3 * (p - 1)


@pytest.mark.parametrize("t_f,t_b,t_w", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1), (3, 3, 2), (2, 2, 2)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w_when_w_is_no_longer_than_f(t_f, t_b, t_w):
    for p, m in ZB_CASES:
        if p <= m <= 16:
            ops = pipe.schedule("zb-h1", p, m, t_forward=t_f, t_backward=t_b, t_weight=t_w)
            assert pipe.makespan(ops) - m * (t_f + t_b + t_w) == (p - 1) * (t_f + t_b - t_w), (p, m)


def test_zb_h1_holds_p_on_every_stage_the_peak_of_1f1b():
    for p, m in ZB_CASES:
        held = pipe.peak_activations("zb-h1", p, m)
        assert held == [min(p, m)] * p
        assert max(held) == max(pipe.peak_activations("1f1b", p, m))


def test_zb_h1_orders_are_1f1b_with_w_put_off_by_the_stage_index():
    for p, m in ZB_CASES:
        orders = pipe.zb_h1_orders(p, m)
        assert [[op for op in order if op[0] != "W"] for order in orders] == pipe.one_f_one_b_orders(p, m)
        for s, order in enumerate(orders):
            for i in range(m - s):
                # the W of micro-batch i right after the B of micro-batch i + s
                assert order[order.index(("B", i + s)) + 1] == ("W", i)
            # the W's of the last s micro-batches at the end
            tail = [("W", i) for i in range(max(m - s, 0), m)]
            assert order[len(order) - len(tail) :] == tail


def test_zb_h1_timeline_respects_dependencies():
    ops = pipe.schedule("zb-h1", 4, 6)
    end = _ends(ops)
    for op in ops:
        if op.kind == "F" and op.stage > 0:
            assert op.slot >= end[("F", op.stage - 1, op.microbatch)]
        if op.kind == "B" and op.stage < 3:
            assert op.slot >= end[("B", op.stage + 1, op.microbatch)]
        if op.kind == "W":
            assert op.slot >= end[("B", op.stage, op.microbatch)]
    _one_at_a_time(ops)


# --- the data model ------------------------------------------------------------------------------


def test_op_keeps_its_old_fields_and_defaults():
    op = pipe.Op(1, 2.0, 3, "F")
    assert (op.duration, op.chunk) == (1, 0)
    assert pipe.op_label(op) == "F3" and pipe.op_label(op._replace(chunk=1), chunks=True) == "F3b"


def test_grid_names_chunks_and_weight_gradients():
    rows = pipe.grid(pipe.schedule("interleaved", 2, 2, n_chunks=2))
    assert rows[0][:4] == ["F0a", "F1a", "F0b", "F1b"]
    assert "W0" in pipe.grid(pipe.schedule("zb-h1", 2, 2))[1]
    assert "F0a" not in pipe.format_grid(pipe.schedule("1f1b", 2, 2))


def test_validate_orders_with_w_and_chunks():
    with pytest.raises(ValueError, match="W0 before B0"):
        pipe.validate_orders([[("F", 0), ("W", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="F, B and W"):
        pipe.validate_orders([[("F", 0), ("B", 0), ("W", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="B0b before F0b"):
        pipe.validate_orders([[("F", 0, 0), ("B", 0, 1), ("F", 0, 1), ("B", 0, 0)]])
    with pytest.raises(ValueError, match="deadlock"):
        # device 0 waits for chunk 0's backward, which needs chunk 1's forward on device 0
        pipe.timeline(
            [[("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)], [("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("B", 0, 0)]]
        )


def test_in_flight_counts_until_w_when_there_are_ws():
    assert pipe.in_flight([("F", 0), ("B", 0), ("F", 1), ("W", 0), ("B", 1), ("W", 1)]) == 2
    assert pipe.in_flight([("F", 0), ("B", 0), ("F", 1), ("B", 1)]) == 1


def test_stage_orders_knows_every_kind():
    for kind in pipe.ALL_KINDS:
        pipe.validate_orders(pipe.stage_orders(kind, 2, 4))
    assert pipe.KINDS == ("gpipe", "1f1b")
    with pytest.raises(ValueError, match="unknown schedule"):
        pipe.stage_orders("zb-h2", 2, 2)


def test_draw_timeline_draws_chunks_and_ws():
    fig = Figure()
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 1)
    draw_timeline(axes[0], pipe.schedule("interleaved", 2, 4, n_chunks=2))
    draw_timeline(axes[1], pipe.schedule("zb-h1", 2, 4))
    assert "F0a" in [t.get_text() for t in axes[0].texts]
    legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert legend == ["forward", "input gradient (B)", "weight gradient (W)"]


def test_describe_timeline_lists_each_stage_in_time_order():
    ops = pipe.schedule("gpipe", 2, 2)
    text = describe_timelines({"GPipe": ops})
    assert text == KEY + "GPipe: 6 time units; stage 0: F0@0 F1@1 B0@4 B1@5; stage 1: F0@1 F1@2 B0@3 B1@4."
    # measured, in seconds: stage 0 busy 4 ms of 5, stage 1 2 ms of 5
    busy = [[[0.0, 0.001, "F0"], [0.002, 0.005, "B0"]], [[0.001, 0.002, "F0"], [0.002, 0.003, "B0"]]]
    alt, plain = describe_measured({"naive": {"busy": busy}}, {"naive": pipe.schedule("gpipe", 2, 1)})
    assert "measured (ms), idle 40%: stage 0: F0 0.0-1.0 B0 2.0-5.0; stage 1: F0 1.0-2.0 B0 2.0-3.0." in alt
    assert (
        plain.startswith(KEY + "naive, predicted idle 50%: 4 time units; stage 0: F0@0 B0@3;")
        and "2.0-5.0" not in plain
    )
