"""Chapter 07a: pipeline-schedule charts, and an explorer of GPipe and 1F1B over
``model_parallel``'s schedules."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .. import model_parallel as pipe
from .base import Explorer

COLORS = {"F": "#4c78a8", "B": "#f58518", "W": "#54a24b"}
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def _shade(kind: str, chunk: int) -> tuple[float, float, float]:
    """The colour of ``kind``; darker on odd chunks, so that neighbouring chunks stand apart."""
    return tuple(c * (0.6 if chunk % 2 else 1.0) for c in to_rgb(COLORS[kind]))


def draw_timeline(ax, ops: Sequence[pipe.Op], title: str = "", labels: bool = True, unit: str = "time slot"):
    """Draw a timeline (stage rows, time columns) on ``ax``: forward blue, backward orange, weight
    gradient (W) green; with several chunks per device, odd chunks darker and labels "F3a", "F3b"."""
    n_stages = max(op.stage for op in ops) + 1
    chunks = any(op.chunk for op in ops)
    for op in ops:
        ax.broken_barh(
            [(op.slot, op.duration)],
            (op.stage - 0.4, 0.8),
            facecolors=_shade(op.kind, op.chunk),
            edgecolor="white",
            linewidth=0.8,
        )
        if labels:
            ax.text(
                op.slot + op.duration / 2,
                op.stage,
                pipe.op_label(op, chunks),
                ha="center",
                va="center",
                color="white",
                fontsize=6 if chunks else 7,
            )
    ax.set_yticks(range(n_stages), [f"stage {s}" for s in range(n_stages)])
    ax.set_ylim(n_stages - 0.5, -0.5)
    ax.set_xlim(min(op.slot for op in ops), max(op.slot + op.duration for op in ops))
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10, loc="left")
    # With W drawn, B is the input gradient only.
    split = any(op.kind == "W" for op in ops)
    names = {"F": "forward", "B": "input gradient (B)" if split else "backward", "W": "weight gradient (W)"}
    handles = [Patch(color=COLORS[k], label=names[k]) for k in COLORS if any(op.kind == k for op in ops)]
    if chunks:
        handles.append(Patch(color=_shade("F", 1), label="odd chunks darker"))
    ax.legend(
        handles=handles, fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(handles), frameon=False
    )


def summary(n_stages: int, n_microbatches: int) -> str:
    """Bubble and peak activations of both schedules, as plain lines."""
    lines = [
        f"p = {n_stages} stages, m = {n_microbatches} micro-batches",
        f"bubble (p-1)/(m+p-1) = {pipe.bubble_fraction(n_stages, n_microbatches):.1%}",
    ]
    for kind in pipe.KINDS:
        ops = pipe.schedule(kind, n_stages, n_microbatches)
        lines.append(
            f"{NAMES[kind]:>5}: {pipe.makespan(ops):.0f} slots, idle {pipe.idle_fraction(ops):.1%}, "
            f"micro-batches held per stage {pipe.peak_activations(kind, n_stages, n_microbatches)}"
        )
    return "\n".join(lines)


class PipelineExplorer(Explorer):
    """Sliders for stages and micro-batches; both schedules' timelines, their bubble and memory."""

    draws = True

    def __init__(self, n_stages: int = 4, n_microbatches: int = 8):
        common = dict(
            continuous_update=False, style={"description_width": "120px"}, layout=widgets.Layout(width="420px")
        )
        super().__init__(
            {
                "n_stages": widgets.IntSlider(value=n_stages, min=1, max=8, description="stages p", **common),
                "n_microbatches": widgets.IntSlider(
                    value=n_microbatches, min=1, max=16, description="micro-batches m", **common
                ),
            }
        )

    def summary(self) -> str:
        return summary(**self.values)

    def figure(self) -> Figure:
        p, m = self.values["n_stages"], self.values["n_microbatches"]
        fig = Figure(figsize=(9, 1.2 + 0.9 * p), dpi=80)
        FigureCanvasAgg(fig)
        axes = fig.subplots(2, 1, sharex=True)
        for ax, kind in zip(axes, pipe.KINDS):
            ops = pipe.schedule(kind, p, m)
            draw_timeline(
                ax,
                ops,
                f"{NAMES[kind]}: idle {pipe.idle_fraction(ops):.0%}, "
                f"held per stage {pipe.peak_activations(kind, p, m)}",
                labels=m <= 12,
            )
        fig.tight_layout()
        return fig

    def __repr__(self) -> str:
        return f"PipelineExplorer(stages={self.values['n_stages']}, microbatches={self.values['n_microbatches']})"


def pipeline_explorer(n_stages: int = 4, n_microbatches: int = 8) -> PipelineExplorer:
    """An explorer of GPipe and 1F1B: stages and micro-batches -> timelines, bubble, activations."""
    return PipelineExplorer(n_stages, n_microbatches)


# How the text alternatives name operations: "F3@2" is micro-batch 3's forward, starting at time 2.
KEY = (
    "Pipeline timelines, an operation as kind, micro-batch and start "
    "(F forward, B backward, W weight gradient, L loss). "
)


def describe_timeline(ops: Sequence[pipe.Op]) -> str:
    """What ``draw_timeline`` draws, as text: each stage's operations in time order, with their start
    (an operation's label, "@", its slot), and the span the timeline covers."""
    chunks = any(op.chunk for op in ops)
    n_stages = max(op.stage for op in ops) + 1
    rows = []
    for s in range(n_stages):
        mine = sorted((op for op in ops if op.stage == s), key=lambda op: op.slot)
        rows.append(f"stage {s}: " + " ".join(f"{pipe.op_label(op, chunks)}@{op.slot:g}" for op in mine))
    return f"{pipe.makespan(ops):g} time units; " + "; ".join(rows)


def describe_timelines(panels: dict[str, Sequence[pipe.Op]]) -> str:
    """The text alternative of a figure of timelines, one panel per title: each title, then
    ``describe_timeline`` of its operations."""
    return KEY + " ".join(f"{title}: {describe_timeline(ops)}." for title, ops in panels.items())


def describe_measured(run: dict, predicted: dict[str, Sequence[pipe.Op]]) -> tuple[str, str]:
    """The text alternative of the measured-vs-predicted figure of chapter 07a: per schedule, the
    predicted timeline and each stage's measured intervals (ms after the first began); and a plain
    text without the measured times (they differ from run to run)."""
    alt, plain = [], []
    for name, ops in predicted.items():
        busy = run[name]["busy"]
        t0 = min(interval[0] for stage in busy for interval in stage)
        stages = "; ".join(
            f"stage {s}: " + " ".join(f"{label} {1e3 * (a - t0):.1f}-{1e3 * (b - t0):.1f}" for a, b, label in intervals)
            for s, intervals in enumerate(busy)
        )
        head = f"{name}, predicted idle {pipe.idle_fraction(ops):.0%}: {describe_timeline(ops)}"
        alt.append(f"{head}; measured (ms), idle {pipe.measured_idle_fraction(busy):.0%}: {stages}.")
        plain.append(f"{head}; and the measured timeline beside it (its times differ from run to run).")
    return KEY + " ".join(alt), KEY + " ".join(plain)
