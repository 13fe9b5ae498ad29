"""Chapter 03's figures, drawn from its own computation: each collective as the tensors on every rank
before and after (read from what ``c03_collectives.py`` printed), and the ring all-reduce step by
step (from ``collectives.ring_allreduce``'s trace: which chunk each rank sends, adds or copies).

``collective_rows`` and ``ring_frames`` turn those results into what is drawn where; the ``draw_``
functions only place it on Axes."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from .collectives import Trace

# One colour per rank (up to 8), and the colour of a reduced value and of an undefined buffer.
RANK_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff", "#d9d9d9"]
REDUCED_COLOUR = "#a7d7c5"
UNDEFINED_COLOUR = "white"

# "  rank 1: [10, 11] -> [30, 32] (undefined: do not read)", as c03_collectives.py prints it.
RANK_LINE = re.compile(r"^\s+rank (\d+): (.+?) -> (\[.*\])(.*)$")


def parse_rank_lines(output: str) -> dict[str, list[tuple[object, object, str]]]:
    """What each collective did on each rank, from the script's output: title -> per rank
    (before, after, note), rank order; titles without "before -> after" lines are left out."""
    found: dict[str, list[tuple[object, object, str]]] = {}
    title = None
    for line in output.splitlines():
        m = RANK_LINE.match(line)
        if m and title is not None:
            rank, before, after, note = m.groups()
            rows = found.setdefault(title, [])
            if int(rank) != len(rows):
                raise ValueError(f"{title}: rank {rank} printed out of rank order")
            rows.append((ast.literal_eval(before), ast.literal_eval(after), note.strip(" ()")))
        elif line and not line[0].isspace():
            title = line.strip()
    return found


@dataclass
class Segment:
    """One box of a rank's row: its values, where they come from (a rank, "reduced" or
    "undefined"), and a note under the values."""

    text: str
    source: int | str
    note: str = ""


@dataclass
class Row:
    before: list[Segment]
    after: list[Segment]


def _text(values) -> str:
    return " ".join(f"{v:g}" for v in values)


def _copied_or_summed(values: list, befores: list) -> Segment:
    # A value some rank started with was copied from it; any other is a reduction.
    if values in befores:
        return Segment(_text(values), befores.index(values))
    return Segment(_text(values), "reduced", "sum")


def collective_rows(rows: list[tuple[object, object, str]]) -> list[Row]:
    """Per rank, the boxes before and after one collective: a value equal to some rank's input is
    that rank's colour (a broadcast copies rank 0's), a list of tensors one box per tensor (an
    all-gather: one per rank), a value no rank had is a reduction, and a buffer the script calls
    undefined is drawn as such. A list of chunks before (reduce-scatter) is one box per chunk."""
    befores = [before for before, _, _ in rows]
    drawn = []
    for rank, (before, after, note) in enumerate(rows):
        if before and isinstance(before[0], list):
            left = [Segment(_text(chunk), rank) for chunk in before]
        else:
            left = [Segment(_text(before), rank)]
        if "undefined" in note:
            right = [Segment(_text(after), "undefined", "undefined")]
        elif isinstance(before[0], list) and after not in befores:
            right = [Segment(_text(after), "reduced", f"sum of chunks {rank}")]
        elif after and isinstance(after[0], list):
            right = [_copied_or_summed(part, befores) for part in after]
        else:
            right = [_copied_or_summed(after, befores)]
        drawn.append(Row(left, right))
    return drawn


def _colour(source: int | str) -> str:
    if source == "reduced":
        return REDUCED_COLOUR
    if source == "undefined":
        return UNDEFINED_COLOUR
    return RANK_COLOURS[source % len(RANK_COLOURS)]


def _boxes(ax, segments: list[Segment], x0: float, width: float, y: float) -> None:
    w = width / len(segments)
    for i, seg in enumerate(segments):
        x = x0 + i * w
        ax.add_patch(
            FancyBboxPatch(
                (x + 0.02, y - 0.32),
                w - 0.04,
                0.64,
                boxstyle="round,pad=0,rounding_size=0.08",
                facecolor=_colour(seg.source),
                edgecolor="black",
                linewidth=0.8,
                linestyle="--" if seg.source == "undefined" else "-",
            )
        )
        label = seg.text + (f"\n({seg.note})" if seg.note else "")
        ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=11 if len(segments) == 1 else 9.5)


def draw_collective(ax, title: str, rows: list[Row]) -> None:
    """One collective: a row per rank, its tensor before (left) and after (right)."""
    n = len(rows)
    for rank, row in enumerate(rows):
        y = n - 1 - rank
        ax.text(-0.15, y, f"rank {rank}", ha="right", va="center", fontsize=11)
        _boxes(ax, row.before, 0.0, 2.0, y)
        ax.annotate("", xy=(2.45, y), xytext=(2.05, y), arrowprops={"arrowstyle": "->", "color": "0.3"})
        _boxes(ax, row.after, 2.5, 2.4, y)
    ax.text(1.0, n - 0.45, "before", ha="center", fontsize=11, color="0.3")
    ax.text(3.7, n - 0.45, "after", ha="center", fontsize=11, color="0.3")
    ax.set_title(title, fontsize=13, family="monospace")
    ax.set(xlim=(-0.9, 5.0), ylim=(-0.6, n - 0.1))
    ax.axis("off")


@dataclass
class RingFrame:
    """The ring after one step: ``labels[rank][chunk]`` the ranks summed in that chunk ("0+2"),
    ``complete`` where all N are, the step's messages (src, dst, chunk), and the cells the step
    wrote (dst, chunk): added to in reduce-scatter, overwritten in all-gather."""

    title: str
    labels: list[list[str]]
    complete: list[list[bool]]
    messages: list[tuple[int, int, int]] = field(default_factory=list)
    written: set[tuple[int, int]] = field(default_factory=set)
    phase: str = "start"


def ring_frames(trace: Trace) -> list[RingFrame]:
    """The start, then one frame per step of the simulated ring (reduce-scatter, then all-gather)."""
    n = trace.world_size
    frames = []
    for k, state in enumerate(trace.states):
        labels = [["+".join(str(r) for r in sorted(cell)) for cell in row] for row in state]
        complete = [[len(cell) == n for cell in row] for row in state]
        if k == 0:
            frames.append(RingFrame("start: each rank its own tensor", labels, complete))
            continue
        step = trace.steps()[k - 1]
        phase = step[0].phase
        verb = "adds" if phase == "reduce-scatter" else "copies"
        title = f"{phase} {step[0].step + 1} of {n - 1}: receiver {verb}"
        messages = [(m.src, m.dst, m.chunk) for m in step]
        frames.append(RingFrame(title, labels, complete, messages, {(d, c) for _, d, c in messages}, phase))
    return frames


def _shade(label: str, complete: bool) -> str:
    # Darker with more ranks summed; a finished sum green.
    if complete:
        return "#52b788"
    summed = label.count("+") + 1
    return ["#edf2fb", "#c1d3fe", "#abc4ff", "#8fb0ff", "#7a9cff", "#6b8cff", "#5c7cfa", "#4c6ef5"][min(summed - 1, 7)]


def draw_ring_frame(ax, frame: RingFrame) -> None:
    """One frame: a row per rank, a column per chunk, each cell naming the ranks summed in it; the
    chunk each rank sent this step has an arrow down to its right neighbour (rank N-1's leaves at
    the bottom and arrives at rank 0 from the top); the cells written are outlined in red."""
    n = len(frame.labels)
    for rank, row in enumerate(frame.labels):
        y = n - 1 - rank
        for c, label in enumerate(row):
            written = (rank, c) in frame.written
            ax.add_patch(
                Rectangle(
                    (c, y),
                    0.86,
                    0.7,
                    facecolor=_shade(label, frame.complete[rank][c]),
                    edgecolor="#d62828" if written else "0.4",
                    linewidth=2.5 if written else 0.8,
                )
            )
            ax.text(c + 0.43, y + 0.35, label, ha="center", va="center", fontsize=10)
        ax.text(-0.1, y + 0.35, f"rank {rank}", ha="right", va="center", fontsize=11)
    for src, dst, c in frame.messages:
        x = c + 0.43
        if dst == src + 1:
            ax.annotate("", xy=(x, n - 1 - dst + 0.7), xytext=(x, n - 1 - src), arrowprops={"arrowstyle": "-|>"})
        else:
            # Round the ring: out of the bottom, back in at the top.
            ax.annotate("", xy=(x, -0.28), xytext=(x, n - 1 - src), arrowprops={"arrowstyle": "-|>"})
            ax.text(x, -0.32, f"to rank {dst}", ha="center", va="top", fontsize=9)
            ax.annotate("", xy=(x, n - 1 - dst + 0.7), xytext=(x, n - 0.02), arrowprops={"arrowstyle": "-|>"})
            ax.text(x, n, f"from rank {src}", ha="center", va="bottom", fontsize=9)
    for c in range(n):
        ax.text(c + 0.43, -0.75, f"chunk {c}", ha="center", va="top", fontsize=10, color="0.3")
    ax.set_title(frame.title, fontsize=11)
    ax.set(xlim=(-0.9, n), ylim=(-1.1, n + 0.35))
    ax.axis("off")


def describe_collectives(runs: dict[str, list[tuple[object, object, str]]], names: list[str]) -> str:
    """The figure's text alternative: per collective, each rank's tensor before and after."""
    parts = []
    for name in names:
        rows = collective_rows(runs[name])
        ranks = "; ".join(
            f"rank {r}: {' | '.join(s.text for s in row.before)} to {' | '.join(s.text for s in row.after)}"
            + (f" ({row.after[0].note})" if row.after[0].note else "")
            for r, row in enumerate(rows)
        )
        parts.append(f"{name}: {ranks}.")
    return f"{len(names)} collectives on {len(runs[names[0]])} ranks, each rank's tensor before and after. " + " ".join(
        parts
    )


def describe_ring(frames: list[RingFrame]) -> str:
    """The ring figure's text alternative: per step, who sends which chunk, and what each holds."""
    n = len(frames[0].labels)
    parts = [f"Ring all-reduce of {n} ranks, one panel per step; each cell lists the ranks summed in a chunk."]
    for frame in frames[1:]:
        sends = ", ".join(f"rank {s} sends chunk {c} to rank {d}" for s, d, c in frame.messages)
        holds = "; ".join(f"rank {r}'s chunks: {', '.join(row)}" for r, row in enumerate(frame.labels))
        parts.append(f"{frame.title}: {sends}; after it {holds}.")
    return " ".join(parts)


def collectives_figure(
    runs: dict[str, list[tuple[object, object, str]]], names: list[str], title: str | None = None
) -> Figure:
    """The collectives ``names`` (titles of ``parse_rank_lines``), three to a row, and a key to the
    colours in the last free panel."""
    fig = Figure(figsize=(12.5, 6.4), layout="constrained")
    n = len(runs[names[0]])
    fig.suptitle(
        title or f"{len(names)} collectives on {n} ranks, as they ran: each rank's tensor before and after", fontsize=12
    )
    cols = 3
    rows = -(-(len(names) + 1) // cols)
    axes = fig.subplots(rows, cols).flat
    for ax, name in zip(axes, names):
        draw_collective(ax, name, collective_rows(runs[name]))
    key = axes[len(names)]
    handles = [Patch(facecolor=_colour(r), edgecolor="black", label=f"rank {r}'s own tensor") for r in range(n)]
    handles.append(Patch(facecolor=REDUCED_COLOUR, edgecolor="black", label="summed over all ranks"))
    handles.append(Patch(facecolor="white", edgecolor="black", linestyle="--", label="undefined: do not read"))
    key.legend(handles=handles, loc="center", fontsize=12, frameon=False, title="colours", title_fontsize=12)
    for ax in list(axes)[len(names) :]:
        ax.axis("off")
    return fig


def ring_figure(frames: list[RingFrame], title: str | None = None) -> Figure:
    """Every frame of ``ring_frames`` side by side, with a key to the colours."""
    n = len(frames[0].labels)
    fig = Figure(figsize=(14, 4.2), layout="constrained")
    default = f"Ring all-reduce of {n} ranks, step by step: each cell names the ranks summed in that chunk"
    fig.suptitle(title or default, fontsize=12)
    # Room at the bottom for the key.
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))
    for ax, frame in zip(fig.subplots(1, len(frames)), frames):
        draw_ring_frame(ax, frame)
    handles = [
        Patch(facecolor=_shade("0", False), edgecolor="0.4", label="one rank's own value"),
        Patch(facecolor=_shade("0+1", False), edgecolor="0.4", label="a partial sum"),
        Patch(facecolor=_shade("", True), edgecolor="0.4", label=f"the sum of all {n} ranks"),
        Patch(facecolor="white", edgecolor="#d62828", linewidth=2.5, label="written in this step"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=12, frameon=False)
    return fig
