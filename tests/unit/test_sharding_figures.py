"""parallel_course.sharding_figures: what chapter 08's figures put where."""

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parallel_course import memory
from parallel_course.sharding_figures import (
    PART_COLOURS,
    describe_rest,
    describe_timeline,
    draw_rest,
    fsdp_timeline,
    rest_figure,
    rest_layout,
    shard_numel,
    shard_rows,
    stored_parameters,
    timeline_figure,
)

# Chapter 08's model: inp 32 -> 128, 4 blocks of 128 -> 128, head 128 -> 5.
UNITS = {"root": [(128, 32), (128,), (5, 128), (5,)], **{f"b{i}": [(128, 128), (128,)] for i in range(4)}}
BLOCKS = [f"b{i}" for i in range(4)]


@pytest.mark.parametrize(
    "stage, sharded",
    [
        ("DDP", []),
        ("ZeRO-1", ["optimizer states"]),
        ("ZeRO-2", ["gradients", "optimizer states"]),
        ("ZeRO-3", ["weights", "gradients", "optimizer states"]),
    ],
)
def test_rest_layout_gives_rank_r_its_rth_slice_of_each_sharded_part_and_all_of_the_others(stage, sharded):
    layout = rest_layout(1e9, 4, stage)
    for rank, held in enumerate(layout):
        for h in held:
            if h.part in sharded:
                assert (h.start, h.stop) == pytest.approx((rank / 4, (rank + 1) / 4))
            else:
                assert (h.start, h.stop) == (0.0, 1.0)
    # The bytes are the chapter's formulas.
    assert sum(h.nbytes for h in layout[2]) == pytest.approx(memory.per_rank_bytes(1e9, 4, stage))


def test_rest_layout_at_the_papers_setting_gives_its_figure_1():
    per_rank = [sum(h.nbytes for h in rest_layout(7.5e9, 64, s)[0]) / memory.GB for s in memory.STAGES]
    assert [round(b, 1) for b in per_rank] == [120.0, 31.4, 16.6, 1.9]


def test_draw_rest_fills_a_box_as_wide_as_its_bytes_where_the_rank_keeps_it():
    ax = Figure().subplots()
    draw_rest(ax, rest_layout(1e9, 2, "ZeRO-1"), {"weights": 2, "gradients": 2, "optimizer states": 12}, "t")
    filled = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_fill()]
    # Per rank: weights and gradients whole, the optimizer's half (rank 0 the top half).
    assert len(filled) == 6
    optimizer = [p for p in filled if p.get_width() == pytest.approx(1.2)]
    assert [(p.get_y(), p.get_height()) for p in optimizer] == [(0.5, 0.5), (0.0, 0.5)]
    assert [p for p in filled if p.get_width() == pytest.approx(0.2)][0].get_height() == 1


def test_rest_figure_titles_each_stage_with_its_bytes_per_rank():
    fig = Figure()
    rest_figure(fig, 7.5e9, 4)
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "DDP: 120.0 GB per rank",
        "ZeRO-1: 52.5 GB per rank",
        "ZeRO-2: 41.2 GB per rank",
        "ZeRO-3: 30.0 GB per rank",
    ]
    assert "ZeRO-1: each rank keeps all of the weights, all of the gradients, 1/4 of the optimizer states" in (
        describe_rest(7.5e9, 4)
    )


def test_shards_are_cut_as_torch_chunk_cuts_dimension_0():
    assert shard_rows(5, 2) == [3, 2] and shard_rows(128, 2) == [64, 64] and shard_rows(2, 4) == [1, 1, 0, 0]
    assert shard_numel([(5, 128), (5,)], 2, 0) == 3 * 128 + 3


def test_timeline_counts_the_chapters_model_as_fsdp_stored_it():
    # c08_fsdp.py printed 35,523 and 35,394 parameters stored on ranks 0 and 1.
    assert [fsdp_timeline(UNITS, BLOCKS, 2, r)[0].held for r in (0, 1)] == [35_523, 35_394]


def test_timeline_gathers_the_root_throughout_and_one_block_at_a_time_forward_then_in_reverse():
    moments = fsdp_timeline(UNITS, BLOCKS, 2, 0)
    names = [m.name.replace("\n", " ") for m in moments]
    assert names == [
        "at rest",
        *[f"forward {b}" for b in BLOCKS],
        *[f"backward {b}" for b in reversed(BLOCKS)],
        "after backward",
    ]
    whole = [[u for u, g in m.gathered.items() if g] for m in moments]
    assert whole[0] == whole[-1] == []
    assert whole[1] == ["root", "b0"] and whole[5] == ["root", "b3"] and whole[8] == ["root", "b0"]
    # Gathered: the root's whole 4,869 parameters instead of its 2,499, a block's 16,512 instead of 8,256.
    assert moments[1].held - moments[0].held == (4_869 - 2_499) + (16_512 - 8_256)


def test_timeline_refuses_units_without_a_single_root():
    with pytest.raises(ValueError, match="one root"):
        fsdp_timeline({"b0": [(4, 4)]}, ["b0"], 2)


def test_timeline_figure_draws_a_cell_per_unit_and_moment_dark_where_gathered():
    fig = Figure()
    moments = fsdp_timeline(UNITS, BLOCKS, 2, 0)
    timeline_figure(fig, moments, list(UNITS), 0, 2)
    ax = fig.axes[0]
    cells = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(cells) == len(UNITS) * len(moments)
    dark = sum(
        1
        for p in cells
        if p.get_facecolor()[:3] == pytest.approx((0.12156862745098039, 0.4666666666666667, 0.7058823529411765))
    )
    assert dark == sum(sum(m.gathered.values()) for m in moments) == 16
    assert "35,523" in {t.get_text() for t in ax.texts}
    assert describe_timeline(moments, 0, 2).startswith(
        "Rank 0 of 2 under FSDP2, moment by moment: at rest: whole "
        "nothing, 35,523 parameters; forward b0: whole root, b0"
    )


def test_stored_parameters_reads_the_scripts_table_in_rank_order():
    table = (
        "rank | parameters | param bytes\n   0 |     35,523 |     142,092 |\n   1 |     35,394 |     141,576 |\n"
        " all |     70,917 |     283,668 |"
    )
    assert stored_parameters(table) == [35_523, 35_394]
    with pytest.raises(ValueError, match="one row per rank"):
        stored_parameters("nothing here")


def test_colours_are_one_per_part():
    assert list(PART_COLOURS) == ["weights", "gradients", "optimizer states"]
