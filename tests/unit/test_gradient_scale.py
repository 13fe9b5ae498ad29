"""parallel_course.gradient_scale: chapter 15's figures draw the data they are given."""

import pytest
from matplotlib.figure import Figure

from parallel_course.gradient_scale import describe_gaps, describe_norms, plot_gaps, plot_norms


def test_plot_norms_draws_each_run_per_step_the_reference_under_and_the_clip_line():
    runs = {"one": {"gradient_norms": [2.0, 1.0]}, "slip": {"gradient_norms": [4.0, 2.0]}}
    ax = Figure().subplots()
    plot_norms(ax, runs, reference="one", clip=1.5)
    one, slip, clip = ax.get_lines()
    assert list(one.get_xdata()) == [1, 2] and list(one.get_ydata()) == [2.0, 1.0]
    assert one.get_linewidth() > slip.get_linewidth() and one.get_zorder() < slip.get_zorder()
    assert list(slip.get_ydata()) == [4.0, 2.0]
    assert list(clip.get_ydata()) == [1.5, 1.5] and clip.get_linestyle() == "--"
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one", "slip", "clip at 1.5"]


def test_plot_gaps_draws_absolute_gaps_floored_and_the_tolerance():
    ax = Figure().subplots()
    plot_gaps(ax, {"ddp": [0.0, -2e-7], "slip": [0.5, -0.5]}, tolerance=1e-4, what="Gradient norms", floor=1e-9)
    ddp, slip, tolerance = ax.get_lines()
    assert list(ddp.get_ydata()) == [1e-9, 2e-7]
    assert list(slip.get_ydata()) == [0.5, 0.5] and list(slip.get_xdata()) == [1, 2]
    assert list(tolerance.get_ydata()) == [1e-4, 1e-4]
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] == pytest.approx(5e-10)
    assert ax.get_title() == "Gradient norms against the reference"


def test_plot_gaps_draws_the_background_runs_grey_under_the_others_named_once():
    ax = Figure().subplots()
    background = {"ddp": [1e-8, 0.0], "fsdp": [2e-8, 1e-8]}
    plot_gaps(ax, {"slip": [0.5, 0.5]}, 1e-4, "Gradient norms", background=background, background_label="layouts")
    ddp, fsdp, slip, _ = ax.get_lines()
    assert list(ddp.get_ydata()) == [1e-8, 1e-9] and list(fsdp.get_ydata()) == [2e-8, 1e-8]
    assert ddp.get_color() == fsdp.get_color() == "0.6" and ddp.get_zorder() < slip.get_zorder()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["layouts", "slip", "tolerance 0.0001"]


def test_describe_norms_says_each_runs_norms_and_the_steps_above_the_clip():
    runs = {"one": {"gradient_norms": [2.0, 1.0]}, "slip": {"gradient_norms": [4.0, 2.0]}}
    alt = describe_norms(runs, reference="one", clip=1.5)
    assert "a dashed line at the clip, 1.5" in alt
    assert "one (the reference, thick grey): 2, 1, above the clip line in step 1;" in alt
    assert "slip: 4, 2, above the clip line in every step." in alt


def test_describe_gaps_says_where_each_run_leaves_the_tolerance_and_the_background_together():
    gaps = {"slip": [0.0, -0.5, 2e-3], "all": [1.0, 1.0, 1.0], "ddp": [3e-8, -8.6e-8, 0.0], "same": [0.0, 0.0, 0.0]}
    alt = describe_gaps(gaps, 1e-4, "Losses", background={"fsdp": [2e-9], "tp": [-4e-9]}, background_label="layouts")
    assert "slip: above the tolerance in steps 2, 3, at most 0.5" in alt
    assert "all: above the tolerance in every step, at most 1" in alt
    assert "ddp: within the tolerance in every step, below 1e-07" in alt
    assert "same: equal in every step" in alt
    assert alt.endswith("In grey, layouts (fsdp, tp): within the tolerance in every step, below 1e-08.")
