"""What chapter 15 draws of the gradient's scale: the whole gradient's norm per step, run by run
(``train_gpt.py``'s ``metrics.json``, or a training in the kernel with the same keys), and how far
each run's per-step figures lie from a reference's, on a log scale beside the tolerance."""

from __future__ import annotations

import math
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


def _steps(steps: Sequence[int], n_steps: int) -> str:
    if len(steps) == n_steps:
        return "every step"
    return "no step" if not steps else f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"


def describe_norms(runs: dict[str, dict], reference: str, clip: float | None = None) -> str:
    """The text alternative of ``plot_norms``: each run's norm per step, and the steps where it lies
    above ``clip`` (those clipping scales down)."""
    parts = []
    for name, run in runs.items():
        norms = run["gradient_norms"]
        text = f"{name}{' (the reference, thick grey)' if name == reference else ''}: " + ", ".join(
            f"{n:.3g}" for n in norms
        )
        if clip is not None:
            text += f", above the clip line in {_steps([i + 1 for i, n in enumerate(norms) if n > clip], len(norms))}"
        parts.append(text)
    clip_text = "" if clip is None else f"; a dashed line at the clip, {clip:.3g}"
    return f"The whole gradient's norm before clipping per step, log scale{clip_text}. " + "; ".join(parts) + "."


def _gap(gap: Sequence[float], tolerance: float) -> str:
    sizes = [abs(g) for g in gap]
    above = [i + 1 for i, g in enumerate(sizes) if g > tolerance]
    if above:
        return f"above the tolerance in {_steps(above, len(sizes))}, at most {max(sizes):.2g}"
    if max(sizes) == 0:
        return "equal in every step"
    # An order of magnitude, not the rounding's own digits: the same on another machine.
    return f"within the tolerance in every step, below {10 ** math.ceil(math.log10(max(sizes))):.0e}"


def describe_gaps(
    gaps: dict[str, Sequence[float]],
    tolerance: float,
    what: str,
    background: dict[str, Sequence[float]] | None = None,
    background_label: str = "",
) -> str:
    """The text alternative of ``plot_gaps``: for each run, the steps where it lies above the
    tolerance and by how much at most, or how far below it stays; the background runs together."""
    text = f"{what}' |relative difference| from the reference per step, log scale, the tolerance {tolerance:g} dashed. "
    text += "; ".join(f"{name}: {_gap(gap, tolerance)}" for name, gap in gaps.items()) + "."
    if background:
        together = [g for gap in background.values() for g in gap]
        text += f" In grey, {background_label} ({', '.join(background)}): {_gap(together, tolerance)}."
    return text
