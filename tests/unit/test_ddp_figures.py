"""parallel_course.ddp_figures: what chapters 04 and 05's figures put where, from DistributedSampler's
own indices and from the buckets chapter 05's comm hook recorded."""

import copy

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from parallel_course.ddp_figures import (
    backward_order,
    bucket_rows,
    buckets_figure,
    describe_buckets,
    describe_loss_curves,
    describe_sampler,
    describe_timeline,
    item_readers,
    sampler_epochs,
    sampler_figure,
    timeline_figure,
)


def test_sampler_epochs_are_the_samplers_own_indices_and_repeat_without_set_epoch():
    without = sampler_epochs(10, 3, epochs=3, set_epoch=False)
    with_ = sampler_epochs(10, 3, epochs=3, set_epoch=True)
    # As chapter 04 prints them (seed 0): the same in every epoch without set_epoch.
    assert without[0] == [[4, 5, 0, 2], [1, 3, 8, 4], [7, 9, 6, 1]]
    assert without[1] == without[2] == without[0]
    assert with_[0] == without[0]
    assert with_[1] != with_[0] and with_[2] != with_[1]
    # Every rank reads ceil(10 / 3) = 4 items, padded: 12 reads.
    assert all(len(indices) == 4 for epoch in with_ for indices in epoch)


def test_item_readers_put_every_read_in_its_items_cell_padding_twice():
    reads = sampler_epochs(10, 3, epochs=2, set_epoch=True)
    grid = item_readers(reads, 10)
    for epoch, row in zip(reads, grid):
        assert sum(len(readers) for readers in row) == sum(len(indices) for indices in epoch) == 12
        for rank, indices in enumerate(epoch):
            for position, item in enumerate(indices, start=1):
                assert (rank, position) in row[item]
        # Two items are read twice (padding 10 to 12), the others once.
        assert sorted(len(readers) for readers in row) == [1] * 8 + [2] * 2
    # Epoch 0: item 4 is rank 0's 1st read and rank 1's 4th (the padded copy).
    assert grid[0][4] == [(0, 1), (1, 4)]


def test_sampler_figure_draws_a_box_per_read_and_lists_the_reads_in_its_text():
    without = sampler_epochs(10, 3, epochs=3, set_epoch=False)
    with_ = sampler_epochs(10, 3, epochs=3, set_epoch=True)
    fig = sampler_figure(without, with_, 10)
    assert isinstance(fig, Figure)
    left, right = fig.get_axes()
    assert (left.get_title(), right.get_title()) == ("no set_epoch", "sampler.set_epoch(epoch)")
    # 3 epochs x 12 reads per panel.
    assert [sum(isinstance(p, Rectangle) for p in ax.patches) for ax in (left, right)] == [36, 36]
    alt = describe_sampler(without, with_, 10)
    assert "Without set_epoch: Epoch 0: rank 0 reads [4, 5, 0, 2]" in alt
    assert f"Epoch 1: rank 0 reads {with_[1][0]}" in alt


# As c05_ddp_internals.py saves it (step 4 on 2 ranks; the times vary from run to run).
TIMELINES = {
    "unset": {
        "backward_ms": 60.5,
        "buckets": [
            {"bucket": 0, "tensors": 4, "mb": 1.0, "layers": ["10", "12"], "start": 6.3, "end": 29.8},
            {"bucket": 1, "tensors": 10, "mb": 5.01, "layers": ["0", "2", "4", "6", "8"], "start": 18.8, "end": 59.6},
        ],
    },
    "25": {
        "backward_ms": 27.5,
        "buckets": [
            {
                "bucket": 0,
                "tensors": 14,
                "mb": 6.01,
                "layers": ["0", "2", "4", "6", "8", "10", "12"],
                "start": 18.5,
                "end": 26.4,
            }
        ],
    },
    "1": {
        "backward_ms": 32.1,
        "buckets": [
            {"bucket": b, "tensors": 4 if b == 0 else 2, "mb": 1.0, "layers": layers, "start": 2.5 + 2 * b, "end": 30.0}
            for b, layers in enumerate([["10", "12"], ["8"], ["6"], ["4"], ["2"], ["0"]])
        ],
    },
}


def test_buckets_span_their_layers_in_backward_order_and_are_launched_in_order():
    assert backward_order(TIMELINES) == ["12", "10", "8", "6", "4", "2", "0"]
    unset, whole, small = bucket_rows(TIMELINES)
    assert unset.label == "bucket_cap_mb unset (default)" and whole.label == "bucket_cap_mb=25"
    assert [(b.index, b.layers, b.first, b.last) for b in unset.buckets] == [
        (0, ["12", "10"], 0, 1),
        (1, ["8", "6", "4", "2", "0"], 2, 6),
    ]
    assert [(b.first, b.last) for b in whole.buckets] == [(0, 6)]
    assert [b.launched for b in small.buckets] == [1, 2, 3, 4, 5, 6]
    assert [b.start_ms for b in small.buckets] == [2.5, 4.5, 6.5, 8.5, 10.5, 12.5]


def test_launch_order_follows_the_recorded_start_not_the_bucket_index():
    swapped = copy.deepcopy(TIMELINES)
    swapped["unset"]["buckets"][0]["start"] = 40.0
    unset = bucket_rows(swapped)[0]
    assert [(b.index, b.launched) for b in unset.buckets] == [(0, 2), (1, 1)]


def test_bucket_rows_refuse_a_record_with_a_layer_missing_twice_or_out_of_backward_order():
    missing = copy.deepcopy(TIMELINES)
    missing["25"]["buckets"][0]["layers"] = ["0", "2", "4", "6", "8", "10"]
    with pytest.raises(ValueError, match="expected each"):
        bucket_rows(missing)
    apart = copy.deepcopy(TIMELINES)
    apart["unset"]["buckets"][0]["layers"] = ["8", "12"]
    apart["unset"]["buckets"][1]["layers"] = ["0", "2", "4", "6", "10"]
    with pytest.raises(ValueError, match="not adjacent"):
        bucket_rows(apart)


def test_buckets_figure_draws_a_box_per_bucket_and_its_text_leaves_the_times_out():
    fig = buckets_figure(TIMELINES)
    (ax,) = fig.get_axes()
    assert sum(isinstance(p, FancyBboxPatch) for p in ax.patches) == 2 + 1 + 6
    texts = [t.get_text() for t in ax.texts]
    assert "bucket 1\n10 tensors\n5.01 MiB" in texts
    assert "1st launch\nat 6.3 ms" in texts
    alt = describe_buckets(TIMELINES)
    assert "bucket_cap_mb unset (default): bucket 0, layers 12, 10, 1.00 MiB, all-reduce launched 1st" in alt
    assert "ms" not in alt.replace("MiB", "")


def test_the_timeline_draws_a_bar_per_bucket_from_launch_to_completion_and_its_plain_text_has_no_times():
    fig = timeline_figure(TIMELINES)
    (ax,) = fig.get_axes()
    bars = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert len(bars) == 2 + 1 + 6
    assert bars[0] == pytest.approx((6.3, 29.8)) and bars[2] == pytest.approx((18.5, 26.4))
    assert [t.get_text() for t in ax.get_yticklabels()][:3] == [
        "cap unset, bucket 0 (layers 10,12)",
        "cap unset, bucket 1 (layers 0,2,4,6,8)",
        "cap 25 MiB, bucket 0 (layers 0,2,4,6,8,10,12)",
    ]
    alt, plain = describe_timeline(TIMELINES)
    assert "cap unset, bucket 0 (layers 10,12): 6.3 to 29.8 ms" in alt
    assert "cap 1 MiB, bucket 5 (layers 0)" in plain and " ms" not in plain


def test_describe_loss_curves_names_the_runs_that_draw_one_curve_together():
    runs = {
        "1 process": {"loss": [4.59021, 0.99904], "global_batch_size": 64},
        "2 ranks": {"loss": [4.59019, 0.99897], "global_batch_size": 64},
        "4 ranks": {"loss": [4.59018, 0.99901], "global_batch_size": 64},
        "control": {"loss": [5.7891, 3.678], "global_batch_size": 128},
    }
    alt = describe_loss_curves(runs)
    assert "2 distinct curves" in alt
    assert (
        "1 process (global batch 64), 2 ranks (global batch 64) and 4 ranks (global batch 64): one curve, 4.59, 0.999;"
        in alt
    )
    assert alt.endswith("control (global batch 128): 5.789, 3.678.")
