"""parallel_course.gradient_scale: chapter 15's figures draw the data they are given."""

import pytest
from matplotlib.figure import Figure

from parallel_course.gradient_scale import plot_gaps, plot_norms


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
