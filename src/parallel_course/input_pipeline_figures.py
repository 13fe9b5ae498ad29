"""Chapter 11b's figures, drawn from its own runs: which samples each rank read, in which batch, by
which DataLoader worker, with the noise each drew (from the chapter's ``draw``: index -> (noise,
worker), in the order read); and each step's wait for its batch and its compute, one after the
other, as ``timed_steps`` measured them.

``sample_rows`` and ``timeline`` turn those results into what is drawn where; the ``draw_``
functions only place them on Axes."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

# One colour per DataLoader worker (-1: the training process itself).
WORKER_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#cdb4db", "#ffd6a5", "#a0c4ff", "#f4a3c1", "#d9d9d9"]
MAIN_COLOUR = "#e9ecef"
WAIT_COLOUR, COMPUTE_COLOUR = "#f4a261", "#2a6f97"


@dataclass(frozen=True)
class SampleBox:
    """One sample as a rank's loader yielded it: its index, its batch, the worker that read it
    (-1: the training process), its noise, and whether another rank drew the same noise."""

    index: int
    batch: int
    worker: int
    noise: float
    shared: bool


def sample_rows(draws: list[dict[int, tuple[float, int]]], batch_size: int) -> list[list[SampleBox]]:
    """Per rank, its samples in the order read (``draws[rank]``: index -> (noise, worker), as the
    chapter's ``draw`` returns it), each marked when some other rank drew the same noise."""
    noises = [{noise for noise, _ in d.values()} for d in draws]
    rows = []
    for rank, d in enumerate(draws):
        others = set().union(*(n for r, n in enumerate(noises) if r != rank))
        rows.append(
            [
                SampleBox(index, position // batch_size, worker, noise, noise in others)
                for position, (index, (noise, worker)) in enumerate(d.items())
            ]
        )
    return rows


def _worker_colour(worker: int) -> str:
    return MAIN_COLOUR if worker < 0 else WORKER_COLOURS[worker % len(WORKER_COLOURS)]


def draw_samples(ax, rows: list[list[SampleBox]], title: str) -> None:
    """A row per rank, a box per sample in the order read, a gap between batches; the fill says
    which worker read it, a red frame that another rank drew the same noise."""
    n = len(rows)
    width = 0
    for rank, row in enumerate(rows):
        y = n - 1 - rank
        ax.text(-0.2, y + 0.4, f"rank {rank}", ha="right", va="center", fontsize=14)
        for position, box in enumerate(row):
            x = position + 0.35 * box.batch
            ax.add_patch(
                Rectangle(
                    (x + 0.04, y),
                    0.92,
                    0.8,
                    facecolor=_worker_colour(box.worker),
                    edgecolor="#c1121f" if box.shared else "0.35",
                    linewidth=2.6 if box.shared else 0.8,
                )
            )
            ax.text(
                x + 0.5, y + 0.4, f"sample {box.index}\nnoise {box.noise:.3f}", ha="center", va="center", fontsize=12
            )
            width = max(width, x + 1)
        batches = sorted({b.batch for b in row})
        for batch in batches:
            first = next(i for i, b in enumerate(row) if b.batch == batch)
            count = sum(1 for b in row if b.batch == batch)
            x0 = first + 0.35 * batch
            ax.text(x0 + count / 2, y - 0.03, f"batch {batch}", ha="center", va="top", fontsize=11, color="0.3")
    ax.set_title(title, fontsize=13)
    ax.set(xlim=(-1.3, width + 0.1), ylim=(-0.4, n - 0.15))
    ax.axis("off")


def samples_figure(panels: list[tuple[str, list[list[SampleBox]]]]) -> Figure:
    """One panel per (title, rows), stacked, with a key to the workers and the red frame."""
    ranks = len(panels[0][1])
    fig = Figure(figsize=(13, 1.1 * ranks * len(panels) + 1.6), layout="constrained")
    fig.suptitle(
        f"What each of {ranks} ranks read, in order: batch i built by worker i mod N, and each sample's noise",
        fontsize=14,
    )
    for ax, (title, rows) in zip(fig.subplots(len(panels), 1, squeeze=False).flat, panels):
        draw_samples(ax, rows, title)
    workers = sorted({b.worker for _, rows in panels for row in rows for b in row})
    handles = [
        Patch(facecolor=_worker_colour(w), edgecolor="0.35", label="training process" if w < 0 else f"worker {w}")
        for w in workers
    ]
    handles.append(
        Patch(facecolor="white", edgecolor="#c1121f", linewidth=2.6, label="noise also drawn by another rank")
    )
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=13, frameon=False)
    return fig


def describe_samples(panels: list[tuple[str, list[list[SampleBox]]]]) -> str:
    """The figure's text alternative: per panel and rank, each sample, its worker and its noise."""
    parts = []
    for title, rows in panels:
        parts.append(f"{title}:")
        for rank, row in enumerate(rows):
            boxes = ", ".join(f"{b.index} (worker {b.worker}, noise {b.noise:.3f})" for b in row)
            shared = sum(b.shared for b in row)
            parts.append(f"rank {rank} reads {boxes}; {shared} of its {len(row)} noises also drawn by another rank.")
    return "Samples each rank read, in batches, by worker, with their noise. " + " ".join(parts)


@dataclass(frozen=True)
class Segment:
    """A stretch of one run's timeline: from ``start`` for ``length`` seconds, waiting for the
    batch or computing the step, in step ``step``."""

    step: int
    kind: str
    start: float
    length: float


def timeline(per_step: list[tuple[float, float]]) -> list[Segment]:
    """Each step's wait then its compute, end to end, from ``timed_steps``' ``per_step``."""
    segments, t = [], 0.0
    for step, (wait, compute) in enumerate(per_step):
        segments.append(Segment(step, "wait", t, wait))
        segments.append(Segment(step, "compute", t + wait, compute))
        t += wait + compute
    return segments


def draw_timelines(ax, runs: dict[str, list[Segment]]) -> None:
    """A lane per run, its steps end to end: the wait for the batch, then the step's compute."""
    n = len(runs)
    for lane, segments in enumerate(runs.values()):
        y = n - 1 - lane
        for s in segments:
            colour = WAIT_COLOUR if s.kind == "wait" else COMPUTE_COLOUR
            ax.broken_barh(
                [(s.start * 1e3, s.length * 1e3)], (y - 0.3, 0.6), facecolors=colour, edgecolor="white", linewidth=0.6
            )
        end = segments[-1].start + segments[-1].length
        steps = segments[-1].step + 1
        ax.text(end * 1e3, y, f"  {steps} steps", ha="left", va="center", fontsize=12)
    ax.set_yticks(range(n), list(reversed(runs)), fontsize=13)
    ax.set_xlabel("time (ms), each step's wait for its batch, then its compute", fontsize=12)
    ax.tick_params(axis="x", labelsize=12)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def timeline_figure(runs: dict[str, list[Segment]]) -> Figure:
    fig = Figure(figsize=(12, 0.9 * len(runs) + 1.7), layout="constrained")
    fig.suptitle(
        "The same training steps, as timed in this kernel: what a step waits for its batch, by DataLoader workers",
        fontsize=13,
    )
    ax = fig.add_subplot()
    draw_timelines(ax, runs)
    right = max(s.start + s.length for segments in runs.values() for s in segments)
    ax.set_xlim(0, right * 1e3 * 1.12)
    handles = [
        Patch(facecolor=WAIT_COLOUR, label="waiting for the batch (next(loader))"),
        Patch(facecolor=COMPUTE_COLOUR, label="the step: forward, backward, optimizer"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=12, frameon=False)
    return fig


def describe_timelines(runs: dict[str, list[Segment]]) -> str:
    """The figure's text alternative, with the measured times (machine-dependent)."""
    parts = []
    for name, segments in runs.items():
        wait = sum(s.length for s in segments if s.kind == "wait")
        compute = sum(s.length for s in segments if s.kind == "compute")
        parts.append(
            f"{name}: {len(segments) // 2} steps in {(wait + compute) * 1e3:.0f} ms, "
            f"{wait * 1e3:.0f} ms of it waiting for batches, {compute * 1e3:.0f} ms computing."
        )
    return "Timeline of the timed steps, each a wait for its batch then its compute. " + " ".join(parts)


def plain_timelines(runs: dict[str, list[Segment]]) -> str:
    """A text of the same figure that does not depend on the machine (what nbval compares)."""
    return (
        f"Timeline of the timed steps for {', '.join(runs)}: each step a wait for its batch (orange), then its "
        "compute (blue), end to end; the lengths are this machine's."
    )
