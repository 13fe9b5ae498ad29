"""Figures of where time and memory go, drawn from the chapters' own measurements: a DDP step's
time per rank against one process and against the ideal share (06b, from ``bench_scaling.py``'s
JSON), and what autograd keeps for ``backward()`` in float32 and under autocast (06c, from
``resource_use.saved_for_backward``'s byte counts).

``step_rows`` and ``saved_rows`` compute what is drawn where; the ``draw_`` functions only place
it on Axes; ``describe_`` functions write the text alternatives."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .resource_use import SAVED_KINDS

# What a bar's segment is: its colour, and whether it is drawn as an outline only (a target).
KINDS = {"compute": "#4c78a8", "all-reduce": "#e45756", "DDP step": "#9d9d9d", "ideal": "white"}


@dataclass
class Segment:
    kind: str
    start: float
    length: float
    note: str = ""


@dataclass
class Bar:
    label: str
    segments: list[Segment]

    @property
    def end(self) -> float:
        return max(s.start + s.length for s in self.segments)


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f}"


def step_rows(report: dict, model: str) -> tuple[int, list[Bar]]:
    """For one model of a bench_scaling report, in seconds, the bars of one rank's step at the
    largest N measured: one process on the whole batch, its ideal 1/N share, DDP on one process
    (DDP's own overhead), a rank's computation and all-reduces timed alone (one after the other),
    and the DDP step as measured. Returns (N, bars)."""
    ddp = report["models"][model]["ddp"]
    n = max(int(k) for k in ddp)
    if n < 2:
        raise ValueError(f"{model}: no DDP run on 2+ processes in this report")
    many, one = ddp[str(n)], ddp["1"]
    base = many["one_process_s"]
    sizes = " + ".join(_mib(b) for b in many["bucket_bytes"])
    buckets = f"{many['buckets']} all-reduce{'s' if many['buckets'] > 1 else ''} ({sizes} MiB)"
    bars = [
        Bar("one process, whole batch", [Segment("compute", 0.0, base)]),
        Bar(f"ideal: one process / {n}", [Segment("ideal", 0.0, base / n)]),
        Bar("DDP on one process (overhead)", [Segment("DDP step", 0.0, one["step_s"])]),
        Bar(
            f"a rank of {n}: parts alone",
            [
                Segment("compute", 0.0, many["compute_s"], "compute (no_sync)"),
                Segment("all-reduce", many["compute_s"], many["comm_s"], buckets),
            ],
        ),
        Bar(f"a rank of {n}: DDP step", [Segment("DDP step", 0.0, many["step_s"])]),
    ]
    return n, bars


def draw_step(ax, title: str, bars: list[Bar]) -> None:
    """One model: a row per bar, on a time axis in ms, each bar's length written at its end and
    the all-reduces' buckets above their segment."""
    longest = max(b.end for b in bars) * 1e3
    for y, bar in enumerate(bars):
        for seg in bar.segments:
            ideal = seg.kind == "ideal"
            ax.barh(
                y,
                seg.length * 1e3,
                left=seg.start * 1e3,
                height=0.6,
                color=KINDS[seg.kind],
                edgecolor="black" if ideal else KINDS[seg.kind],
                linestyle="--" if ideal else "-",
            )
            if seg.kind == "all-reduce":
                ax.text(seg.start * 1e3, y - 0.38, seg.note, ha="left", va="bottom", fontsize=9, color="#b22222")
        ax.text(bar.end * 1e3 + 0.01 * longest, y, f"{bar.end * 1e3:.1f} ms", ha="left", va="center", fontsize=10)
    ax.set_yticks(range(len(bars)), [b.label for b in bars], fontsize=10.5)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.22)
    ax.set_xlabel("ms per step (medians)", fontsize=10)
    ax.set_title(title, fontsize=11.5)
    ax.grid(axis="x", alpha=0.3)


def step_figure(report: dict) -> Figure:
    """A panel per model (their times differ by orders of magnitude), and a key to the colours."""
    models = [m for m in report["models"] if max(int(k) for k in report["models"][m]["ddp"]) > 1]
    fig = Figure(figsize=(13, 2.2 + 2.0 * len(models)), layout="constrained")
    fig.suptitle(
        f"Where a rank's step goes: {report['backend']} on {report['device']}, against one process on the whole batch",
        fontsize=13,
    )
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, model in zip(axes, models):
        m = report["models"][model]
        n, bars = step_rows(report, model)
        title = (
            f"{model}: {m['parameters']:,} parameters ({_mib(m['gradient_bytes'])} MiB of gradients), "
            f"global batch {m['global_batch']}, {n} processes"
        )
        draw_step(ax, title, bars)
    handles = [
        Patch(facecolor=KINDS["compute"], label="computation (forward, backward, step)"),
        Patch(facecolor=KINDS["all-reduce"], label="the all-reduces alone, in DDP's buckets"),
        Patch(facecolor=KINDS["DDP step"], label="a DDP step, as measured"),
        Patch(facecolor="white", edgecolor="black", linestyle="--", label="the ideal: one process's time / N"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=10.5, frameon=False)
    return fig


def describe_steps(report: dict) -> str:
    """The text alternative, with this run's times."""
    parts = ["Where a rank's DDP step goes, per model, in ms."]
    for model in report["models"]:
        try:
            _, bars = step_rows(report, model)
        except ValueError:
            continue
        rows = "; ".join(
            f"{b.label}: " + " then ".join(f"{s.note or s.kind} {s.length * 1e3:.1f}" for s in b.segments) for b in bars
        )
        parts.append(f"{model}: {rows}.")
    return " ".join(parts)


def plain_steps(report: dict) -> str:
    """The same, without this machine's times (what strict nbval compares)."""
    models = ", ".join(report["models"])
    return (
        f"Where a rank's DDP step goes ({models}): one process on the whole batch, its ideal share, DDP on one "
        "process, a rank's computation and all-reduces timed alone, and the DDP step as measured."
    )


@dataclass
class Saved:
    """One kind of tensor autograd keeps: where its bar starts and how long it is, in bytes, and
    whether it is new memory (parameters and inputs are kept by reference)."""

    kind: str
    start: int
    nbytes: int

    @property
    def new_memory(self) -> bool:
        return self.kind != "parameters and inputs"


def saved_rows(saved: list[dict[str, int]], names: list[str]) -> list[tuple[str, list[Saved]]]:
    """Per run (float32, autocast), the kinds side by side in bytes: the new memory first
    (activations, copies of parameters), then what is kept by reference."""
    if len(saved) != len(names):
        raise ValueError("one name per run")
    order = [k for k in SAVED_KINDS if k != "parameters and inputs"] + ["parameters and inputs"]
    rows = []
    for name, counts in zip(names, saved):
        if set(counts) != set(SAVED_KINDS):
            raise ValueError(f"{name}: expected the kinds {SAVED_KINDS}, got {sorted(counts)}")
        x, segs = 0, []
        for kind in order:
            segs.append(Saved(kind, x, counts[kind]))
            x += counts[kind]
        rows.append((name, segs))
    return rows


SAVED_COLOURS = {"activations": "#4c78a8", "copies of parameters": "#f58518", "parameters and inputs": "#d9d9d9"}


def draw_saved(ax, rows: list[tuple[str, list[Saved]]]) -> None:
    """A bar per run: its kinds in MiB, the new memory solid, what is kept by reference hatched,
    the new memory's total written after it."""
    longest = max(sum(s.nbytes for s in segs) for _, segs in rows) / 2**20
    for y, (_, segs) in enumerate(rows):
        for s in segs:
            if not s.nbytes:
                continue
            ax.barh(
                y,
                s.nbytes / 2**20,
                left=s.start / 2**20,
                height=0.55,
                color=SAVED_COLOURS[s.kind],
                edgecolor="black",
                hatch=None if s.new_memory else "//",
            )
            # A sliver (the integer targets, say) gets no number: it would cover its neighbours'.
            if s.nbytes / 2**20 < 0.05 * longest:
                continue
            ax.text(
                (s.start + s.nbytes / 2) / 2**20,
                y,
                f"{s.nbytes / 2**20:.2f}",
                ha="center",
                va="center",
                fontsize=10.5,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5},
            )
        new = sum(s.nbytes for s in segs if s.new_memory)
        end = sum(s.nbytes for s in segs) / 2**20
        ax.text(end + 0.02 * longest, y, f"new memory: {new / 2**20:.2f} MiB", ha="left", va="center", fontsize=11)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=11)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.45)
    ax.set_xlabel("MiB kept for backward()", fontsize=10.5)
    ax.grid(axis="x", alpha=0.3)


def saved_figure(saved: list[dict[str, int]], names: list[str], batch: int) -> Figure:
    rows = saved_rows(saved, names)
    fig = Figure(figsize=(11, 3.3), layout="constrained")
    fig.suptitle(f"What autograd keeps for backward(), batch {batch}: counted tensor by tensor", fontsize=13)
    draw_saved(fig.subplots(), rows)
    handles = [
        Patch(facecolor=SAVED_COLOURS["activations"], edgecolor="black", label="activations (new)"),
        Patch(
            facecolor=SAVED_COLOURS["copies of parameters"],
            edgecolor="black",
            label="16-bit copies of the weights (new)",
        ),
        Patch(
            facecolor=SAVED_COLOURS["parameters and inputs"],
            edgecolor="black",
            hatch="//",
            label="parameters and inputs, by reference (no new memory)",
        ),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=10.5, frameon=False)
    return fig


def describe_saved(saved: list[dict[str, int]], names: list[str], batch: int) -> str:
    parts = [f"What autograd keeps for backward() at batch {batch}, in MiB."]
    for name, segs in saved_rows(saved, names):
        kinds = ", ".join(f"{s.kind} {s.nbytes / 2**20:.2f}" for s in segs)
        new = sum(s.nbytes for s in segs if s.new_memory)
        parts.append(f"{name}: {kinds}; new memory {new / 2**20:.2f}.")
    return " ".join(parts)
