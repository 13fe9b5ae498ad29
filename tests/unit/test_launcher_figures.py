"""parallel_course.launcher_figures: what chapter 12's figures put where."""

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from parallel_course.launcher_figures import (
    describe_launches,
    describe_losses,
    draw_launch,
    from_accelerate,
    from_train_gpt,
    launches_figure,
    plot_losses,
)

TOGETHER = {"num_processes": 2, "torch_world_size": 2, "model": "DistributedDataParallel", "per_process_batch": 4}
LONELY = {"num_processes": 1, "torch_world_size": 2, "model": "GPT", "per_process_batch": 8}


def test_views_tell_one_job_from_lonely_workers_by_what_the_runs_reported():
    together = from_accelerate("a", TOGETHER, 8, "notebook_launcher", "Accelerator()")
    lonely = from_accelerate("b", LONELY, 8, "notebook_launcher", "Accelerator()")
    script = from_train_gpt("c", {"world_size": 2, "parallel": "ddp", "global_batch_size": 8}, "torchrun", "setup()")
    assert together.trains_together and script.trains_together and not lonely.trains_together
    assert (lonely.processes, lonely.counted, lonely.per_process_batch) == (2, 1, 8)
    assert (script.model, script.per_process_batch) == ("--parallel ddp", 4)
    # A single process is not a job of several, whatever it reports.
    assert not from_accelerate(
        "d", {**TOGETHER, "torch_world_size": 1, "num_processes": 1}, 8, "x", "y"
    ).trains_together


def test_draw_launch_draws_a_box_per_process_and_the_exchange_only_for_one_job():
    ax = Figure().subplots()
    draw_launch(ax, from_accelerate("Accelerate", TOGETHER, 8, "notebook_launcher", "Accelerator()"))
    texts = {t.get_text() for t in ax.texts}
    assert len([p for p in ax.patches if isinstance(p, FancyBboxPatch)]) == 2 + 2
    assert "process 1\nDistributedDataParallel\n4 of 8 problems" in texts
    assert "gradients all-reduced: one job" in texts and "torch's group: 2 processes; the library counts 2" in texts
    ax = Figure().subplots()
    draw_launch(ax, from_accelerate("trap", LONELY, 8, "notebook_launcher", "Accelerator()"))
    texts = {t.get_text() for t in ax.texts}
    assert "no exchange: each trains alone" in texts and "process 0\nGPT\n8 of 8 problems" in texts
    assert not [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]


def test_launches_figure_has_a_panel_per_launch_and_the_text_says_each():
    views = [
        from_accelerate("Accelerate", TOGETHER, 8, "notebook_launcher", "Accelerator()"),
        from_accelerate("trap", LONELY, 8, "notebook_launcher", "Accelerator()"),
    ]
    fig = Figure()
    launches_figure(fig, views)
    assert [ax.get_title() for ax in fig.axes] == ["Accelerate", "trap"]
    text = describe_launches(views)
    assert "trap: started by notebook_launcher" in text and text.endswith("each alone.")


def test_plot_losses_draws_each_run_per_step_the_reference_under():
    ax = Figure().subplots()
    losses = {"torchrun": [2.5, 2.4], "Accelerate": [2.5, 2.4]}
    plot_losses(ax, losses, "torchrun")
    ref, other = ax.get_lines()
    assert list(ref.get_xdata()) == [1, 2] and list(other.get_ydata()) == [2.5, 2.4]
    assert ref.get_zorder() < other.get_zorder() and ref.get_linewidth() > other.get_linewidth()
    assert describe_losses(losses) == "Loss per step of each run: torchrun: 2.5000, 2.4000; Accelerate: 2.5000, 2.4000"
