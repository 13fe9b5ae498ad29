"""Chapter 00's figures, drawn from its own computation: what this machine offers (cores, GPUs,
backends, from ``machine.describe``) and where the processes of the launch test ran, and the launch
test's all-reduce, rank by rank (from what ``hello_allreduce.py`` printed).

``parse_launch`` and ``machine_picture`` compute what is drawn where; the ``draw_`` functions only
place it on Axes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from matplotlib.patches import FancyBboxPatch, Rectangle

from . import machine
from .collective_figures import RANK_COLOURS, Row, collective_rows

HEADER = re.compile(r"^backend=(\w+) device=(\w+)$", re.M)
PASSED = "OK: every rank holds the sum"
RESULT = re.compile(r"^rank (\d+) of (\d+): all_reduce gave (\S+) \(expected (\S+)\)$", re.M)


@dataclass
class Launch:
    """What ``hello_allreduce.py`` reported: the backend and device it picked, and per rank the
    value ``all_reduce`` left and the one expected."""

    backend: str
    device: str
    world_size: int
    results: list[float]
    expected: float


def parse_launch(output: str) -> Launch:
    """The launch test's report, from its output; refuses an output without one line per rank, or
    without the test's verdict that every rank holds the sum (a failed launch is not drawn)."""
    if PASSED not in output:
        raise ValueError(f"the launch test did not pass ({PASSED!r} missing): read its output above")
    header = HEADER.search(output)
    rows = [(int(r), int(n), float(got), float(want)) for r, n, got, want in RESULT.findall(output)]
    if header is None or not rows or [r for r, *_ in rows] != list(range(rows[0][1])):
        raise ValueError("no launch report (backend=..., then one line per rank in rank order) in the output")
    return Launch(header.group(1), header.group(2), rows[0][1], [got for *_, got, _ in rows], rows[0][3])


def launch_rows(launch: Launch) -> list[Row]:
    """The all-reduce as ``collective_figures`` draws a collective: rank r starts with r + 1."""
    return collective_rows([([r + 1.0], [got], "") for r, got in enumerate(launch.results)])


@dataclass
class Picture:
    """What the machine figure shows: its cores and GPUs, each backend (built in? used?), and the
    device each rank of the launch ran on."""

    cores: int
    gpus: list[str]
    backends: dict[str, tuple[bool, bool]]
    ranks: list[str]


def machine_picture(m: machine.Machine, launch: Launch) -> Picture:
    """The machine as ``machine.describe`` found it, and the launch's ranks placed by the course's
    rule (``machine.placement``); refuses a launch whose backend the rule would not have picked."""
    rule = machine.pick_backend(len(m.gpus), m.backends, launch.world_size)
    if rule != launch.backend:
        raise ValueError(f"the launch used {launch.backend}, the course's rule picks {rule} on this machine")
    ranks = [
        line.split(": ", 1)[1].split(" ")[0] for line in machine.placement(len(m.gpus), launch.world_size, m.backends)
    ]
    backends = {name: (built, name == launch.backend) for name, built in m.backends.items()}
    return Picture(m.logical_cores, list(m.gpus), backends, ranks)


def _box(ax, x, y, w, h, text, face, edge="black", lw=0.8, fontsize=9, **kw):
    ax.add_patch(
        FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0,rounding_size=0.1", facecolor=face, edgecolor=edge, linewidth=lw, **kw
        )
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def draw_machine(ax, picture: Picture, max_cores: int = 16) -> None:
    """Three columns: the processes of the launch, the backend that connects them (the others
    greyed, those not built in crossed out), and the devices they ran on: the CPU's cores, and
    each GPU."""
    n = len(picture.ranks)
    height = max(n, 4)
    # Processes, on the left.
    for r, device in enumerate(picture.ranks):
        y = height - 1 - r * height / n
        _box(ax, 0, y - 0.35, 2.2, 0.7, f"rank {r}\non {device}", RANK_COLOURS[r % len(RANK_COLOURS)])
    ax.text(1.1, height + 0.1, "processes of the launch", ha="center", fontsize=10, weight="bold")
    # Backends, in the middle.
    for i, (name, (built, used)) in enumerate(picture.backends.items()):
        y = height - 1 - i * 1.2
        face = "#52b788" if used else ("#e9ecef" if built else "white")
        label = f"{name}: {'used' if used else 'built in, unused' if built else 'not built in'}"
        _box(ax, 3.2, y - 0.35, 2.6, 0.7, label, face, lw=2.0 if used else 0.8, linestyle="-" if built else "--")
    ax.text(4.5, height + 0.1, "backends of this torch", ha="center", fontsize=10, weight="bold")
    # Devices, on the right: a square per core, a box per GPU.
    shown = min(picture.cores, max_cores)
    per_row = 4
    for c in range(shown):
        col, row = c % per_row, c // per_row
        ax.add_patch(
            Rectangle(
                (6.9 + col * 0.55, height - 1.2 - row * 0.55),
                0.45,
                0.45,
                facecolor="#adb5bd",
                edgecolor="black",
                linewidth=0.5,
            )
        )
    more = f" (first {shown} drawn)" if picture.cores > shown else ""
    ax.text(6.9, height - 0.35, f"CPU: {picture.cores} usable cores{more}", fontsize=9, va="center")
    top = height - 1.6 - (shown - 1) // per_row * 0.55
    if picture.gpus:
        for g, name in enumerate(picture.gpus[:8]):
            _box(ax, 6.9, top - 0.75 - g * 0.6, 3.2, 0.5, f"cuda:{g} {name}", "#ffd166", fontsize=8)
    else:
        _box(ax, 6.9, top - 0.9, 3.2, 0.6, "no GPU", "white", linestyle="--")
    ax.text(8.5, height + 0.1, "devices", ha="center", fontsize=10, weight="bold")
    # Each rank to the backend that connects them, the backend to the devices they ran on.
    used = next(i for i, (_, u) in enumerate(picture.backends.values()) if u)
    backend_y = height - 1 - used * 1.2
    for r in range(n):
        ax.plot([2.2, 3.2], [height - 1 - r * height / n, backend_y], color="0.5", linewidth=0.8, zorder=0)
    on_gpus = sorted({int(d.split(":")[1]) for d in picture.ranks if d.startswith("cuda:")})
    targets = [top - 0.5 - g * 0.6 for g in on_gpus if g < 8] or [height - 1.2 - (shown - 1) // per_row * 0.275 + 0.2]
    for y in targets:
        ax.plot([5.8, 6.9], [backend_y, y], color="0.5", linewidth=0.8, zorder=0)
    if not on_gpus and n > picture.cores:
        ax.text(
            6.9,
            height - 1.45 - (shown - 1) // per_row * 0.55,
            f"{n} processes take turns on {picture.cores} cores",
            fontsize=9,
            va="top",
            color="tab:red",
        )
    ax.set(xlim=(-0.2, 10.4), ylim=(min(-0.6, top - 1.2 - 0.6 * max(len(picture.gpus) - 1, 0)), height + 0.6))
    ax.axis("off")


def describe_machine(picture: Picture) -> str:
    """The machine figure's text alternative."""
    used = next(name for name, (_, u) in picture.backends.items() if u)
    built = ", ".join(name for name, (b, _) in picture.backends.items() if b)
    gpus = f"{len(picture.gpus)} GPUs ({', '.join(picture.gpus)})" if picture.gpus else "no GPU"
    ranks = "; ".join(f"rank {r} on {d}" for r, d in enumerate(picture.ranks))
    return (
        f"This machine: {picture.cores} usable CPU cores and {gpus}; backends built in: {built}. "
        f"The launch test's {len(picture.ranks)} processes talked over {used}: {ranks}."
    )
