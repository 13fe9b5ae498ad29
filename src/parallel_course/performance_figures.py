"""Figures of where time and memory go, drawn from the chapters' own measurements: a DDP step's
time per rank against one process and against the ideal share (06b, from ``bench_scaling.py``'s
JSON), and what autograd keeps for ``backward()`` in float32 and under autocast (06c, from
``resource_use.saved_for_backward``'s byte counts), and the gradient norms clipping saw and left
in either order of ``GradScaler.unscale_`` and ``clip_grad_norm_`` (06c, M17).

``step_rows``, ``saved_rows`` and ``clip_rows`` compute what is drawn where; the ``draw_``
functions place it on Axes; ``describe_`` functions write the text alternatives."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
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


def draw_step(ax, title: str, bars: list[Bar], labels: bool = True) -> None:
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
                ax.text(seg.start * 1e3, y - 0.36, seg.note, ha="left", va="bottom", fontsize=10.5, color="#b22222")
        ax.text(bar.end * 1e3 + 0.01 * longest, y, f"{bar.end * 1e3:.1f} ms", ha="left", va="center", fontsize=11.5)
    ax.set_yticks(range(len(bars)), [b.label for b in bars] if labels else [], fontsize=12)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.22)
    ax.set_xlabel("ms per step (medians)", fontsize=11)
    ax.set_title(title, fontsize=12.5)
    ax.grid(axis="x", alpha=0.3)


def step_figure(report: dict) -> Figure:
    """A panel per model (their times differ by orders of magnitude), and a key to the colours."""
    models = [m for m in report["models"] if max(int(k) for k in report["models"][m]["ddp"]) > 1]
    fig = Figure(figsize=(5 + 4.5 * len(models), 4.6), layout="constrained")
    fig.suptitle(
        f"Where a rank's step goes ({report['backend']} on {report['device']}), against one process on the whole batch",
        fontsize=14,
    )
    # Side by side, the bars' names once on the left.
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for k, (ax, model) in enumerate(zip(axes, models)):
        m = report["models"][model]
        n, bars = step_rows(report, model)
        title = (
            f"{model}: {m['parameters']:,} parameters\n({_mib(m['gradient_bytes'])} MiB of gradients), "
            f"global batch {m['global_batch']}"
        )
        draw_step(ax, title, bars, labels=k == 0)
    handles = [
        Patch(facecolor=KINDS["compute"], label="computation (forward, backward, step)"),
        Patch(facecolor=KINDS["all-reduce"], label="the all-reduces alone, in DDP's buckets"),
        Patch(facecolor=KINDS["DDP step"], label="a DDP step, as measured"),
        Patch(facecolor="white", edgecolor="black", linestyle="--", label="the ideal: one process's time / N"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=12, frameon=False)
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


CLIP_COLOURS = {"norm clip saw": "#7f7f7f", "norm the optimizer uses": "#4c78a8"}


def clip_rows(results: dict[str, tuple[float, float]]) -> list[tuple[str, list[tuple[str, float]]]]:
    """Per order of the calls (06c's M17 cell), its two measured norms: the one
    ``clip_grad_norm_`` saw, and the one of the gradient the optimizer then uses."""
    rows = []
    for order, (seen, final) in results.items():
        if seen <= 0 or final <= 0:
            raise ValueError(f"{order}: a norm of 0 has no place on a log scale")
        rows.append((order, [("norm clip saw", seen), ("norm the optimizer uses", final)]))
    return rows


def draw_clip(ax, order: str, norms: list[tuple[str, float]], max_norm: float) -> None:
    """One order of the calls: each norm as a point on a log scale, on a stem from max_norm (clipping
    is meant to bring the gradient down to max_norm, no further)."""
    for y, (name, value) in enumerate(norms):
        # A stem from max_norm to the norm: how far from what clipping aims at, and which way.
        ax.plot([max_norm, value], [y, y], color=CLIP_COLOURS[name], lw=4, solid_capstyle="butt")
        ax.plot([value], [y], "o", color=CLIP_COLOURS[name], markersize=11, markeredgecolor="black")
        right = value >= max_norm
        ax.text(
            value * (1.8 if right else 1 / 1.8),
            y,
            f"{value:.4g}",
            ha="left" if right else "right",
            va="center",
            fontsize=12,
        )
    ax.axvline(max_norm, color="#d62828", linestyle="--", lw=2)
    ax.set_xscale("log")
    ax.set_yticks(range(len(norms)), [name for name, _ in norms], fontsize=12)
    ax.set_ylim(len(norms) - 0.4, -0.6)
    ax.set_title(order, fontsize=13, loc="left")
    ax.tick_params(axis="x", labelsize=11)
    ax.grid(axis="x", alpha=0.3)


def clip_figure(results: dict[str, tuple[float, float]], max_norm: float, scale: float) -> Figure:
    """A panel per order on one log axis, with a key to max_norm."""
    rows = clip_rows(results)
    fig = Figure(figsize=(11, 1.2 + 1.7 * len(rows)), layout="constrained")
    fig.suptitle(f"GradScaler (scale {scale:g}) and clip_grad_norm_: the order decides what is clipped", fontsize=14)
    axes = fig.subplots(len(rows), 1, sharex=True, squeeze=False)[:, 0]
    values = [v for _, norms in rows for _, v in norms] + [max_norm]
    for ax, (order, norms) in zip(axes, rows):
        draw_clip(ax, order, norms, max_norm)
    axes[-1].set_xlim(min(values) / 100, max(values) * 100)
    axes[-1].set_xlabel("gradient norm (log scale)", fontsize=12)
    handles = [Line2D([], [], color="#d62828", linestyle="--", lw=2, label=f"max_norm = {max_norm:g}")]
    fig.legend(handles=handles, loc="outside lower center", fontsize=12, frameon=False)
    return fig


def describe_clip(results: dict[str, tuple[float, float]], max_norm: float) -> str:
    parts = [f"Gradient norms on a log scale, with max_norm {max_norm:g}."]
    for order, norms in clip_rows(results):
        parts.append(f"{order}: " + ", ".join(f"{name} {value:.4g}" for name, value in norms) + ".")
    return " ".join(parts)
