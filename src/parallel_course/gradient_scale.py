"""What chapter 15 draws of the gradient's scale: the whole gradient's norm per step, run by run
(``train_gpt.py``'s ``metrics.json``, or a training in the kernel with the same keys), and how far
each run's per-step figures lie from a reference's, on a log scale beside the tolerance."""

from __future__ import annotations

from collections.abc import Sequence


def plot_norms(ax, runs: dict[str, dict], reference: str, clip: float | None = None) -> None:
    """On ``ax``, the gradient norm (before clipping) of every step of each run, by name: the
    reference's a thick grey line under the others, a run off by a factor a line of its own, and
    ``clip``, if given, a dashed horizontal line (the norm above which clipping fires)."""
    for name, run in runs.items():
        steps = range(1, len(run["gradient_norms"]) + 1)
        if name == reference:
            ax.plot(steps, run["gradient_norms"], color="0.75", linewidth=5, label=name, zorder=0)
        else:
            ax.plot(steps, run["gradient_norms"], marker="o", markersize=3, label=name)
    if clip is not None:
        ax.axhline(clip, color="black", linestyle="--", linewidth=1, label=f"clip at {clip:g}")
    ax.set(xlabel="step", ylabel="gradient norm", yscale="log", title="The whole gradient's norm, before clipping")
    ax.legend(fontsize=7)


def plot_gaps(
    ax,
    gaps: dict[str, Sequence[float]],
    tolerance: float,
    what: str,
    floor: float = 1e-9,
    background: dict[str, Sequence[float]] | None = None,
    background_label: str = "",
) -> None:
    """On ``ax``, |relative difference| from the reference per step (log scale), a line per run; a
    difference below ``floor`` (an exact match has no place on a log axis) is drawn at ``floor``;
    the tolerance a dashed line. ``what``: the figure compared (losses, gradient norms).
    ``background``: more runs, drawn as thin grey lines under the others, named once in the legend
    by ``background_label``."""
    for i, gap in enumerate((background or {}).values()):
        steps = range(1, len(gap) + 1)
        label = background_label if i == 0 else None
        ax.plot(steps, [max(abs(g), floor) for g in gap], color="0.6", linewidth=1, label=label, zorder=0)
    for name, gap in gaps.items():
        steps = range(1, len(gap) + 1)
        ax.plot(steps, [max(abs(g), floor) for g in gap], marker="o", markersize=3, label=name)
    ax.axhline(tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    ax.set(xlabel="step", ylabel="|relative difference|", yscale="log", title=f"{what} against the reference")
    ax.set_ylim(bottom=floor / 2)
    ax.legend(fontsize=7)
