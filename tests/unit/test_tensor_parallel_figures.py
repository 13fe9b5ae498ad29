"""parallel_course.tensor_parallel_figures: what chapter 07b's figure puts where, from the lines
c07_tensor_parallel.py printed."""

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parallel_course.tensor_parallel_figures import (
    chunk_sizes,
    computes,
    describe_tp,
    draw_split,
    layer_splits,
    parse_tp_run,
    tp_figure,
)

# As c07_tensor_parallel.py prints it (2 ranks; the PASS lines are skipped).
OUTPUT = """2 ranks, backend=gloo device=cpu
column-parallel: weight (32, 16) as a DTensor, placement Shard(dim=0), local shard (16, 16); bias placement Shard(dim=0)
column-parallel: forward ran 1 all_gather, backward 1 all_reduce
PASS column-parallel output: max |difference| <= 1e-05
row-parallel: weight (32, 16) as a DTensor, placement Shard(dim=1), local shard (32, 8); bias placement Replicate()
row-parallel: forward ran 1 all_reduce, backward 1 all_gather
PASS row-parallel output: max |difference| <= 1e-05
MLP column -> ReLU -> row: forward ran 1 all_reduce, backward 1 all_reduce
"""


def test_parse_reads_ranks_placements_local_shards_and_counts():
    run = parse_tp_run(OUTPUT)
    assert run.ranks == 2
    assert run.weights["column-parallel"] == ((32, 16), 0, (16, 16), "Shard(dim=0)")
    assert run.weights["row-parallel"] == ((32, 16), 1, (32, 8), "Replicate()")
    assert run.comms["column-parallel"] == ({"all_gather": 1}, {"all_reduce": 1})
    assert run.comms["MLP column -> ReLU -> row"] == ({"all_reduce": 1}, {"all_reduce": 1})
    # One rank: nothing to send.
    one = parse_tp_run(
        "1 ranks, backend=gloo device=cpu\nrow-parallel: forward ran no collective, backward no collective"
    )
    assert one.comms["row-parallel"] == ({}, {})


def test_parse_refuses_an_output_without_its_ranks_line():
    with pytest.raises(ValueError, match="ranks"):
        parse_tp_run(OUTPUT.split("\n", 1)[1])


def test_chunk_sizes_cut_as_torch_chunk():
    assert chunk_sizes(32, 2) == [16, 16]
    assert chunk_sizes(10, 4) == [3, 3, 3, 1]
    assert chunk_sizes(16, 3) == [6, 6, 4]


def test_column_parallel_ranks_keep_row_blocks_and_compute_whole_slices_of_the_output():
    column, row = layer_splits(parse_tp_run(OUTPUT))
    assert [(s.rows, s.cols, s.out, s.partial) for s in column.shards] == [
        ((0, 16), (0, 16), (0, 16), False),
        ((16, 32), (0, 16), (16, 32), False),
    ]
    assert column.forward == {"all_gather": 1} and column.backward == {"all_reduce": 1}
    assert "features 16:32" in computes(column.shards[1], 32)
    # Row-parallel: a block of columns each, every output feature, but only a partial sum.
    assert [(s.rows, s.cols, s.out, s.partial) for s in row.shards] == [
        ((0, 32), (0, 8), (0, 32), True),
        ((0, 32), (8, 16), (0, 32), True),
    ]
    assert "x[:, 8:16]" in computes(row.shards[1], 32) and "partial" in computes(row.shards[1], 32)


def test_the_blocks_follow_the_run_on_four_ranks():
    four = OUTPUT.replace("2 ranks", "4 ranks").replace("local shard (16, 16)", "local shard (8, 16)")
    four = four.replace("local shard (32, 8)", "local shard (32, 4)")
    column, row = layer_splits(parse_tp_run(four))
    assert [s.rows for s in column.shards] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert [s.cols for s in row.shards] == [(0, 4), (4, 8), (8, 12), (12, 16)]


def test_a_local_shard_that_is_not_the_placements_cut_is_refused():
    # The 2-rank shard printed by a run said to have 4 ranks: the drawing would lie.
    with pytest.raises(ValueError, match="local shard"):
        layer_splits(parse_tp_run(OUTPUT.replace("2 ranks", "4 ranks")))


def test_draw_puts_one_block_of_w_per_rank_and_the_figure_has_a_panel_per_layer():
    run = parse_tp_run(OUTPUT)
    column = layer_splits(run)[0]
    ax = Figure().subplots()
    draw_split(ax, column)
    texts = [t.get_text() for t in ax.texts]
    assert "rank 0\n16×16" in texts and "rank 1\n16×16" in texts
    assert "1 all_gather" in texts and "every rank: all 32" in texts
    # W's blocks, each rank's output bar (outline and filled slice), the joined output's slices.
    assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 2 + 2 * 2 + 2
    fig = tp_figure(run)
    assert len(fig.axes) == 2
    legend = fig.legends[0].get_title().get_text()
    assert legend == "MLP column -> ReLU -> row: forward 1 all_reduce, backward 1 all_reduce"


def test_describe_says_each_ranks_block_and_the_collectives():
    text = describe_tp(parse_tp_run(OUTPUT))
    assert "rank 1 keeps rows 16-31 and columns 0-15 and computes output features 16-31" in text
    assert "rank 0 keeps rows 0-31 and columns 0-7 and computes a partial sum" in text
    assert "Forward runs 1 all_reduce, backward 1 all_gather." in text
