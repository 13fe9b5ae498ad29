"""parallel_course.collective_figures: what chapter 03's figures put where, from the script's output
and the ring's simulation."""

import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from parallel_course import collectives
from parallel_course.collective_figures import (
    REDUCED_COLOUR,
    collective_rows,
    collectives_figure,
    describe_collectives,
    describe_ring,
    draw_collective,
    draw_ring_frame,
    parse_rank_lines,
    ring_figure,
    ring_frames,
)

# As c03_collectives.py prints it (3 ranks).
OUTPUT = """broadcast(t, src=0)
  rank 0: [0, 1] -> [0, 1]
  rank 1: [10, 11] -> [0, 1]
  rank 2: [20, 21] -> [0, 1]
reduce(t, dst=0)
  rank 0: [0, 1] -> [30, 33]
  rank 1: [10, 11] -> [30, 32] (undefined: do not read)
  rank 2: [20, 21] -> [20, 21] (undefined: do not read)
all_gather(list, t)
  rank 0: [0, 1] -> [[0, 1], [10, 11], [20, 21]]
  rank 1: [10, 11] -> [[0, 1], [10, 11], [20, 21]]
  rank 2: [20, 21] -> [[0, 1], [10, 11], [20, 21]]
reduce_scatter(out, list of chunks)
  rank 0: [[0, 1], [2, 3], [4, 5]] -> [30, 33]
  rank 1: [[10, 11], [12, 13], [14, 15]] -> [36, 39]
  rank 2: [[20, 21], [22, 23], [24, 25]] -> [42, 45]
all_gather of the reduce_scatter results == all_reduce?
  rank 0: True
barrier()
  rank 0: reads 'data prepared by rank 0'
"""


def test_parse_keeps_each_collectives_before_and_after_in_rank_order_and_skips_other_lines():
    runs = parse_rank_lines(OUTPUT)
    assert list(runs) == [
        "broadcast(t, src=0)",
        "reduce(t, dst=0)",
        "all_gather(list, t)",
        "reduce_scatter(out, list of chunks)",
    ]
    assert runs["reduce(t, dst=0)"][1] == ([10, 11], [30, 32], "undefined: do not read")
    assert runs["all_gather(list, t)"][2][1] == [[0, 1], [10, 11], [20, 21]]


def test_parse_refuses_ranks_out_of_order():
    with pytest.raises(ValueError, match="rank order"):
        parse_rank_lines("all_reduce(t)\n  rank 1: [1] -> [3]\n  rank 0: [2] -> [3]\n")


def test_rows_colour_a_copy_by_its_source_rank_a_reduction_as_such_and_undefined_buffers_apart():
    runs = parse_rank_lines(OUTPUT)
    broadcast = collective_rows(runs["broadcast(t, src=0)"])
    # Every rank ends with rank 0's tensor: drawn in rank 0's colour.
    assert [row.after[0].source for row in broadcast] == [0, 0, 0]
    assert [row.before[0].source for row in broadcast] == [0, 1, 2]
    reduce = collective_rows(runs["reduce(t, dst=0)"])
    assert [row.after[0].source for row in reduce] == ["reduced", "undefined", "undefined"]
    gather = collective_rows(runs["all_gather(list, t)"])
    assert [[seg.source for seg in row.after] for row in gather] == [[0, 1, 2]] * 3
    scatter = collective_rows(runs["reduce_scatter(out, list of chunks)"])
    assert [len(row.before) for row in scatter] == [3, 3, 3]
    assert [(row.after[0].text, row.after[0].note) for row in scatter] == [
        ("30 33", "sum of chunks 0"),
        ("36 39", "sum of chunks 1"),
        ("42 45", "sum of chunks 2"),
    ]


def test_draw_collective_puts_one_box_per_segment_and_labels_every_rank():
    ax = Figure().subplots()
    draw_collective(ax, "all_gather(list, t)", collective_rows(parse_rank_lines(OUTPUT)["all_gather(list, t)"]))
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    # 3 ranks: one box before, three after.
    assert len(boxes) == 3 * (1 + 3)
    texts = [t.get_text() for t in ax.texts]
    assert {"rank 0", "rank 1", "rank 2", "before", "after"} <= set(texts) and texts.count("10 11") == 4


def test_collectives_figure_has_a_panel_per_collective_and_a_key():
    runs = parse_rank_lines(OUTPUT)
    fig = collectives_figure(runs, list(runs), "collectives")
    assert fig._suptitle.get_text() == "collectives"
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:4] == list(runs)
    legend = fig.axes[4].get_legend()
    assert [t.get_text() for t in legend.get_texts()][-2:] == ["summed over all ranks", "undefined: do not read"]
    assert legend.legend_handles[3].get_facecolor()[:3] == pytest.approx((0xA7 / 255, 0xD7 / 255, 0xC5 / 255))
    assert REDUCED_COLOUR == "#a7d7c5"


def _trace(n):
    return collectives.ring_allreduce([torch.full((n,), 10.0**r) for r in range(n)])


def test_ring_frames_follow_the_simulation_step_by_step():
    frames = ring_frames(_trace(3))
    assert len(frames) == 1 + 2 * 2
    assert frames[0].labels == [["0"] * 3, ["1"] * 3, ["2"] * 3] and not frames[0].messages
    first = frames[1]
    # Reduce-scatter step 1: rank r sends chunk r to rank r + 1, which adds it.
    assert first.messages == [(0, 1, 0), (1, 2, 1), (2, 0, 2)]
    assert first.written == {(1, 0), (2, 1), (0, 2)}
    assert first.labels == [["0", "0", "0+2"], ["0+1", "1", "1"], ["2", "1+2", "2"]]
    assert first.title == "reduce-scatter 1 of 2: receiver adds"
    # After reduce-scatter each rank holds one finished chunk: rank r chunk r + 1.
    assert [[c for c in range(3) if frames[2].complete[r][c]] for r in range(3)] == [[1], [2], [0]]
    assert frames[3].title == "all-gather 1 of 2: receiver copies"
    assert all(all(row) for row in frames[-1].complete)


def test_ring_frames_of_four_ranks_send_the_chunk_the_simulation_names():
    trace = _trace(4)
    frames = ring_frames(trace)
    for frame, step in zip(frames[1:], trace.steps()):
        assert frame.messages == [(m.src, m.dst, m.chunk) for m in step]


def test_draw_ring_frame_outlines_exactly_the_written_cells_and_draws_an_arrow_per_message():
    frame = ring_frames(_trace(3))[1]
    ax = Figure().subplots()
    draw_ring_frame(ax, frame)
    cells = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(cells) == 9
    thick = {(round(p.get_x()), 2 - round(p.get_y())) for p in cells if p.get_linewidth() > 2}
    # (chunk, rank) of the thick outlines: the cells written this step.
    assert thick == {(c, r) for r, c in frame.written}
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    # Rank 2 -> rank 0 goes round the ring: out at the bottom, in at the top.
    assert len(arrows) == 3 + 1
    assert {"from rank 2", "to rank 0"} <= {t.get_text() for t in ax.texts}


def test_ring_figure_draws_every_frame_and_a_key():
    frames = ring_frames(_trace(3))
    fig = ring_figure(frames, "the ring")
    assert [ax.get_title() for ax in fig.axes] == [f.title for f in frames]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "one rank's own value",
        "a partial sum",
        "the sum of all 3 ranks",
        "written in this step",
    ]


def test_text_alternatives_say_what_each_rank_holds():
    runs = parse_rank_lines(OUTPUT)
    text = describe_collectives(runs, ["reduce(t, dst=0)"])
    assert "rank 0: 0 1 to 30 33 (sum); rank 1: 10 11 to 30 32 (undefined)" in text
    ring = describe_ring(ring_frames(_trace(3)))
    assert "reduce-scatter 1 of 2: receiver adds: rank 0 sends chunk 0 to rank 1" in ring
    assert ring.endswith("rank 2's chunks: 0+1+2, 0+1+2, 0+1+2.")
