"""parallel_course.performance_figures: what 06b's step figure and 06c's saved-for-backward figure
put where, from the chapters' own measurements."""

import copy

import pytest
from matplotlib.figure import Figure

from parallel_course.performance_figures import (
    clip_figure,
    clip_rows,
    describe_clip,
    describe_saved,
    describe_steps,
    draw_clip,
    draw_saved,
    draw_step,
    plain_steps,
    saved_figure,
    saved_rows,
    step_figure,
    step_rows,
)

# The shape of bench_scaling.py's JSON (times in s), one model measured on 1 and 2 processes.
REPORT = {
    "backend": "gloo",
    "device": "cpu",
    "models": {
        "compute": {
            "global_batch": 2048,
            "parameters": 795658,
            "gradient_bytes": 3182632,
            "ddp": {
                "1": {"step_s": 0.32, "one_process_s": 0.29, "buckets": 2, "bucket_bytes": [2393128, 789504]},
                "2": {
                    "step_s": 0.217,
                    "one_process_s": 0.291,
                    "compute_s": 0.212,
                    "comm_s": 0.013,
                    "overlap": 0.63,
                    "buckets": 2,
                    "bucket_bytes": [2393128, 789504],
                },
            },
        }
    },
}


def test_step_rows_put_each_measured_time_in_its_bar():
    n, bars = step_rows(REPORT, "compute")
    assert n == 2
    assert [b.label for b in bars] == [
        "one process, whole batch",
        "ideal: one process / 2",
        "DDP on one process (overhead)",
        "a rank of 2: parts alone",
        "a rank of 2: DDP step",
    ]
    assert [b.end for b in bars] == pytest.approx([0.291, 0.1455, 0.32, 0.225, 0.217])
    compute, comm = bars[3].segments
    # The all-reduces start where the computation ends, and name DDP's buckets.
    assert (compute.start, compute.length, comm.start, comm.length) == (0.0, 0.212, 0.212, 0.013)
    assert comm.note == "2 all-reduces (2.28 + 0.75 MiB)"


def test_step_rows_follow_the_largest_world_size_and_refuse_a_report_without_one():
    four = copy.deepcopy(REPORT)
    four["models"]["compute"]["ddp"]["4"] = dict(four["models"]["compute"]["ddp"]["2"], step_s=0.1, buckets=1)
    four["models"]["compute"]["ddp"]["4"]["bucket_bytes"] = [3182632]
    n, bars = step_rows(four, "compute")
    assert n == 4 and bars[1].end == pytest.approx(0.291 / 4) and bars[4].end == 0.1
    assert bars[3].segments[1].note == "1 all-reduce (3.04 MiB)"
    del four["models"]["compute"]["ddp"]["2"], four["models"]["compute"]["ddp"]["4"]
    with pytest.raises(ValueError, match="2\\+ processes"):
        step_rows(four, "compute")


def test_step_drawing_and_texts():
    ax = Figure().subplots()
    _, bars = step_rows(REPORT, "compute")
    draw_step(ax, "compute", bars)
    # One rectangle per segment: 1 + 1 + 1 + 2 + 1.
    assert len(ax.patches) == 6
    assert [t.get_text() for t in ax.get_yticklabels()] == [b.label for b in bars]
    assert "2 all-reduces (2.28 + 0.75 MiB)" in [t.get_text() for t in ax.texts]
    assert len(step_figure(REPORT).axes) == 1
    assert "a rank of 2: parts alone: compute (no_sync) 212.0 then 2 all-reduces" in describe_steps(REPORT)
    # What nbval compares holds no time of this machine.
    assert not any(ch.isdigit() for ch in plain_steps(REPORT))


MIB = 2**20
SAVED = [
    {"activations": 1 * MIB, "copies of parameters": 0, "parameters and inputs": 3 * MIB // 2},
    {"activations": 3 * MIB // 4, "copies of parameters": MIB // 2, "parameters and inputs": 0},
]
NAMES = ["float32", "autocast bfloat16"]


def test_saved_rows_put_new_memory_first_and_references_last():
    rows = saved_rows(SAVED, NAMES)
    assert [name for name, _ in rows] == NAMES
    float32 = rows[0][1]
    assert [(s.kind, s.start, s.nbytes, s.new_memory) for s in float32] == [
        ("activations", 0, MIB, True),
        ("copies of parameters", MIB, 0, True),
        ("parameters and inputs", MIB, 3 * MIB // 2, False),
    ]
    with pytest.raises(ValueError, match="kinds"):
        saved_rows([{"activations": 1}], ["float32"])


def test_saved_drawing_and_text_count_only_new_memory_as_new():
    ax = Figure().subplots()
    draw_saved(ax, saved_rows(SAVED, NAMES))
    texts = [t.get_text() for t in ax.texts]
    assert "new memory: 1.00 MiB" in texts and "new memory: 1.25 MiB" in texts
    # Empty kinds are not drawn: 2 bars of 2 parts each.
    assert len(ax.patches) == 4
    # A sliver is drawn without a number over it.
    sliver = [SAVED[0], dict(SAVED[1], **{"parameters and inputs": 4096})]
    ax = Figure().subplots()
    draw_saved(ax, saved_rows(sliver, NAMES))
    assert len(ax.patches) == 5 and "0.00" not in [t.get_text() for t in ax.texts]
    assert len(saved_figure(SAVED, NAMES, 256).axes) == 1
    text = describe_saved(SAVED, NAMES, 256)
    assert "float32: activations 1.00, copies of parameters 0.00, parameters and inputs 1.50; new memory 1.00." in text


# As 06c's M17 cell measures them: (norm clip saw, norm the optimizer uses) per order.
CLIPS = {"clip, then unscale (wrong)": (5.168e4, 7.629e-06), "unscale_, then clip (right)": (0.7886, 0.5)}


def test_clip_rows_keep_each_orders_two_norms_and_refuse_a_zero():
    rows = clip_rows(CLIPS)
    assert rows == [
        ("clip, then unscale (wrong)", [("norm clip saw", 5.168e4), ("norm the optimizer uses", 7.629e-06)]),
        ("unscale_, then clip (right)", [("norm clip saw", 0.7886), ("norm the optimizer uses", 0.5)]),
    ]
    with pytest.raises(ValueError, match="log scale"):
        clip_rows({"no gradient": (0.0, 0.0)})


def test_clip_drawing_stems_each_norm_from_max_norm():
    ax = Figure().subplots()
    draw_clip(ax, *clip_rows(CLIPS)[0], max_norm=0.5)
    # Per norm a stem and a point; the stems start at max_norm and end at the measured norm.
    stems = [line for line in ax.lines if len(line.get_xdata()) == 2 and line.get_xdata()[0] != line.get_xdata()[1]]
    assert sorted(tuple(line.get_xdata()) for line in stems) == [(0.5, 7.629e-06), (0.5, 5.168e4)]
    # The small norm's label on the left of its point, the large one's on the right.
    labels = {t.get_text(): t.get_horizontalalignment() for t in ax.texts}
    assert labels == {"5.168e+04": "left", "7.629e-06": "right"}
    fig = clip_figure(CLIPS, 0.5, 2.0**16)
    assert len(fig.axes) == 2 and "65536" in fig._suptitle.get_text()
    assert describe_clip(CLIPS, 0.5).endswith(
        "unscale_, then clip (right): norm clip saw 0.7886, norm the optimizer uses 0.5."
    )
