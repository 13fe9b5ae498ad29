"""Chapter 12's figures, drawn from its own computation: what each process of each launch did (the
summaries the runs wrote: the group's size, what the library counted, the model it trained, its
share of the batch), and the losses of every step of the three runs side by side.

``launch_view`` computes what is drawn where; the ``draw_`` functions only place it on Axes."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import FancyBboxPatch

from .collective_figures import RANK_COLOURS


@dataclass
class LaunchView:
    """One launch as its run reported it: the processes in torch's group, how many the library
    counted as one job, the model each process trained, and its share of the global batch; plus
    who started the processes and who joined the group (the layer the launch adds)."""

    name: str
    started_by: str
    joined_by: str
    processes: int
    counted: int
    model: str
    per_process_batch: int
    global_batch: int

    @property
    def trains_together(self) -> bool:
        """One job of several processes: the library counted them all and each took a share."""
        return self.processes > 1 and self.counted == self.processes and self.per_process_batch < self.global_batch


def from_accelerate(name: str, summary: dict, global_batch: int, started_by: str, joined_by: str) -> LaunchView:
    """A view of the summary the chapter's ``train`` wrote (``work/c12_accelerate.json``)."""
    return LaunchView(
        name,
        started_by,
        joined_by,
        processes=summary["torch_world_size"],
        counted=summary["num_processes"],
        model=summary["model"],
        per_process_batch=summary["per_process_batch"],
        global_batch=global_batch,
    )


def from_train_gpt(name: str, metrics: dict, started_by: str, joined_by: str) -> LaunchView:
    """A view of ``train_gpt.py``'s ``metrics.json``: its layout's ranks all count, each taking an
    equal share of the global batch."""
    world = metrics["world_size"]
    return LaunchView(
        name,
        started_by,
        joined_by,
        processes=world,
        counted=world,
        model=f"--parallel {metrics['parallel']}",
        per_process_batch=metrics["global_batch_size"] // world,
        global_batch=metrics["global_batch_size"],
    )


def _box(ax, x, y, w, h, text, face, **kw):
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.1", facecolor=face, edgecolor="black", **kw)
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)


def draw_launch(ax, view: LaunchView) -> None:
    """One launch: who started the processes and who joined them, then a box per process with the
    model it trained and its share of the batch, joined by the gradients' all-reduce when the
    processes train as one job, or marked alone when they do not."""
    _box(ax, 0, 3.3, 4.6, 0.55, f"started by {view.started_by}", "#e9ecef")
    _box(ax, 0, 2.6, 4.6, 0.55, f"group joined by {view.joined_by}", "#e9ecef")
    width = 4.6 / view.processes - 0.3
    for r in range(view.processes):
        x = r * (width + 0.3 + 0.3 / max(view.processes - 1, 1))
        text = f"process {r}\n{view.model}\n{view.per_process_batch} of {view.global_batch} problems"
        _box(ax, x, 0.9, width, 1.4, text, RANK_COLOURS[r % len(RANK_COLOURS)])
    if view.trains_together:
        ax.annotate("", xy=(4.6 - width, 1.6), xytext=(width, 1.6), arrowprops={"arrowstyle": "<->", "lw": 1.5})
        ax.text(2.3, 0.55, "gradients all-reduced: one job", ha="center", fontsize=9, color="tab:green", weight="bold")
    else:
        ax.text(2.3, 0.55, "no exchange: each trains alone", ha="center", fontsize=9, color="tab:red", weight="bold")
    ax.text(
        2.3,
        0.15,
        f"torch's group: {view.processes} processes; the library counts {view.counted}",
        ha="center",
        fontsize=9,
    )
    ax.set_title(view.name, fontsize=11)
    ax.set(xlim=(-0.1, 4.7), ylim=(0, 4.0))
    ax.axis("off")


def launches_figure(fig, views: list[LaunchView]) -> None:
    """Every launch side by side on ``fig``."""
    for ax, view in zip(fig.subplots(1, len(views)), views):
        draw_launch(ax, view)


def describe_launches(views: list[LaunchView]) -> str:
    """The text alternative of ``launches_figure``."""
    parts = [
        f"{v.name}: started by {v.started_by}, group joined by {v.joined_by}; {v.processes} processes, "
        f"the library counts {v.counted}; each trains {v.model} on {v.per_process_batch} of "
        f"{v.global_batch} problems; " + ("gradients all-reduced, one job." if v.trains_together else "each alone.")
        for v in views
    ]
    return " ".join(parts)


def plot_losses(ax, losses: dict[str, list[float]], reference: str) -> None:
    """The loss of every step of each run; the reference a thick grey line under the others."""
    # Hollow markers, each smaller than the one before: equal values stay visible one inside the other.
    markers = ["s", "o", "^", "D"]
    others = [name for name in losses if name != reference]
    for name, values in losses.items():
        steps = range(1, len(values) + 1)
        if name == reference:
            ax.plot(steps, values, color="0.75", linewidth=6, label=name, zorder=0)
            continue
        i = others.index(name)
        ax.plot(
            steps,
            values,
            marker=markers[i % len(markers)],
            markersize=14 - 4 * i,
            markerfacecolor="none",
            markeredgewidth=2,
            linestyle="--",
            linewidth=1,
            label=name,
        )
    ax.set(xlabel="step", ylabel="loss (global batch)")
    ax.legend(fontsize=9)


def describe_losses(losses: dict[str, list[float]]) -> str:
    """The text alternative of ``plot_losses``."""
    return "Loss per step of each run: " + "; ".join(
        f"{name}: {', '.join(f'{v:.4f}' for v in values)}" for name, values in losses.items()
    )
