"""Chapter 01's figures, drawn from its own computation: the two ways of splitting a step (data or
model parallelism) over the two-stage net the chapter cuts, with what each worker holds and what
crosses between them; and the bytes each machine's link carries to average a gradient with a
parameter server or a ring (``costmodel.traffic``, the numbers the chapter prints).

``parallelism_splits`` and ``link_loads`` turn those results into what is drawn where; the
``draw_`` functions only place it on Axes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from . import costmodel

SERVER_COLOUR = "#ffb703"
WORKER_COLOUR = "#8ecae6"
RANK_COLOURS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c1", "#cdb4db", "#ffd6a5", "#a0c4ff", "#d9d9d9"]
MB = 1e6

# --- 01: data vs model parallelism ----------------------------------------------------------------


@dataclass
class Split:
    """One way of splitting a step over workers: the network's layers, which of them each worker
    holds, its parameters and samples, and what crosses between workers per step (bytes)."""

    name: str
    layers: list[str]
    holds: list[list[bool]]
    parameters: list[int]
    samples: list[int]
    message: str
    message_bytes: int


def _layer_name(module) -> str:
    if hasattr(module, "in_features"):
        return f"{type(module).__name__} {module.in_features}→{module.out_features}"
    return type(module).__name__


def _count(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def parallelism_splits(net, stages, x, h) -> tuple[Split, Split]:
    """Data and model parallelism of ``net`` (an ``nn.Sequential``) over ``len(stages)`` workers,
    from chapter 01's computation: data parallelism gives every worker the whole net and a chunk
    of the batch ``x``, and averages a gradient as large as the model; model parallelism gives
    worker k the layers of ``stages[k]`` and the whole batch, and sends the activations ``h``
    (forward, and as many bytes of their gradients backward). Refuses stages that do not cut the
    net into consecutive parts, each layer held once."""
    layers = list(net)
    held = [[any(layer is m for m in stage) for layer in layers] for stage in stages]
    order = [k for k in range(len(stages)) for _ in range(sum(held[k]))]
    if [sum(column) for column in zip(*held)] != [1] * len(layers) or order != sorted(order):
        raise ValueError("the stages must cut the net into consecutive parts, each layer in one stage")
    names = [_layer_name(m) for m in layers]
    n = len(stages)
    dtype_bytes = next(net.parameters()).element_size()
    data = Split(
        name=f"data parallelism, {n} workers",
        layers=names,
        holds=[[True] * len(layers) for _ in range(n)],
        parameters=[_count(layers)] * n,
        samples=[len(chunk) for chunk in x.chunk(n)],
        message="gradients,\naveraged (all-reduce)",
        message_bytes=_count(layers) * dtype_bytes,
    )
    model = Split(
        name=f"model parallelism, {n} workers",
        layers=names,
        holds=held,
        parameters=[_count(stage) for stage in stages],
        samples=[len(x)] * n,
        message="activations forward,\ntheir gradients backward",
        message_bytes=h.numel() * h.element_size(),
    )
    return data, model


def draw_split(ax, split: Split) -> None:
    """A column per worker, its layers stacked (filled: held, faint: not held), its parameters and
    samples under it, and what crosses between workers on an arrow."""
    n, depth = len(split.holds), len(split.layers)
    xs = [3.6 * k for k in range(n)]
    for k, x in enumerate(xs):
        ax.add_patch(
            FancyBboxPatch(
                (x - 1.1, -1.45), 2.2, depth + 1.6, boxstyle="round,pad=0.05", facecolor="0.96", edgecolor="0.4"
            )
        )
        ax.text(x, depth + 0.35, f"worker {k}", ha="center", va="center", fontsize=14, weight="bold")
        for i, (name, held) in enumerate(zip(split.layers, split.holds[k])):
            y = depth - 1 - i
            ax.add_patch(
                FancyBboxPatch(
                    (x - 0.95, y + 0.1),
                    1.9,
                    0.8,
                    boxstyle="round,pad=0,rounding_size=0.08",
                    facecolor=RANK_COLOURS[k % len(RANK_COLOURS)] if held else "white",
                    edgecolor="black" if held else "0.75",
                    linestyle="-" if held else ":",
                )
            )
            ax.text(x, y + 0.5, name, ha="center", va="center", fontsize=12, color="black" if held else "0.6")
        ax.text(
            x,
            -0.75,
            f"{split.parameters[k]:,} parameters\n{split.samples[k]} samples of the batch",
            ha="center",
            va="center",
            fontsize=12,
        )
    for k, (a, b) in enumerate(zip(xs, xs[1:])):
        if all(all(holds) for holds in split.holds):
            # Every worker holds every layer: what crosses is the whole model's gradient.
            start, end = (a + 1.15, depth / 2), (b - 1.15, depth / 2)
        else:
            # The activations of worker k's last layer go into worker k+1's first.
            cut = sum(sum(holds) for holds in split.holds[: k + 1])
            start, end = (a + 0.95, depth - cut + 0.5), (b - 0.95, depth - cut - 0.5)
        ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "<|-|>", "linewidth": 1.5})
        ax.text(
            (a + b) / 2,
            max(start[1], end[1]) + 0.15,
            f"{split.message}\n{split.message_bytes:,} bytes",
            ha="center",
            va="bottom",
            fontsize=12,
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "0.6"},
            zorder=5,
        )
    ax.set_title(split.name, fontsize=16)
    ax.set(xlim=(-1.4, xs[-1] + 1.4), ylim=(-1.7, depth + 0.8))
    ax.axis("off")


def splits_figure(splits: tuple[Split, ...], title: str | None = None) -> Figure:
    fig = Figure(figsize=(14, 5.2), layout="constrained")
    for ax, split in zip(fig.subplots(1, len(splits)), splits):
        draw_split(ax, split)
    fig.suptitle(title or "Two things to split: the batch (left) or the model (right); per step", fontsize=16)
    return fig


def describe_splits(splits: tuple[Split, ...]) -> str:
    """The text alternative: per split, what each worker holds and computes on, and what it sends."""
    parts = []
    for split in splits:
        workers = "; ".join(
            f"worker {k} holds {', '.join(name for name, h in zip(split.layers, holds) if h)} "
            f"({split.parameters[k]:,} parameters) and computes on {split.samples[k]} samples"
            for k, holds in enumerate(split.holds)
        )
        message = split.message.replace("\n", " ")
        parts.append(f"{split.name}: {workers}; between them: {message}, {split.message_bytes:,} bytes per step.")
    return " ".join(parts)


# --- 01: bytes per link ---------------------------------------------------------------------------


@dataclass
class Link:
    """One machine's link to the network: who it is, and the bytes it sends and receives per step."""

    name: str
    sends: float
    receives: float


def link_loads(algorithm: str, world_size: int, model_bytes: float) -> list[Link]:
    """Every machine's link in one averaging step of a ``model_bytes`` gradient over ``world_size``
    workers, from ``costmodel.traffic``: a parameter server ("ps") has the server's link first,
    then the workers'; a ring ("ring") has one link per rank."""
    traffic = costmodel.traffic(algorithm, world_size, model_bytes)
    if algorithm == "ps":
        workers = [Link(f"worker {r}", traffic.worker_sends, traffic.worker_receives) for r in range(world_size)]
        return [Link("server", traffic.server_sends, traffic.server_receives), *workers]
    return [Link(f"rank {r}", traffic.worker_sends, traffic.worker_receives) for r in range(world_size)]


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / MB:.0f} MB" if nbytes / MB >= 10 else f"{nbytes / MB:.1f} MB"


def draw_links(ax, algorithm: str, links: list[Link], widest: float) -> None:
    """Each machine on a circle round a switch, its link drawn as thick as the bytes it carries
    (``widest``: the bytes drawn 16 points wide) and labelled, outside, with what it sends and
    receives; a ring's direction as arrows from each rank to the next."""
    ax.add_patch(
        FancyBboxPatch(
            (-0.42, -0.17), 0.84, 0.34, boxstyle="round,pad=0.02", facecolor="0.85", edgecolor="0.3", zorder=2
        )
    )
    ax.text(0, 0, "switch", ha="center", va="center", fontsize=12.5, zorder=3)
    n = len(links)
    angles = [math.pi / 2 - 2 * math.pi * i / n for i in range(n)]
    for angle, link in zip(angles, links):
        x, y = 1.5 * math.cos(angle), 1.5 * math.sin(angle)
        width = 16 * (link.sends + link.receives) / widest
        ax.plot([0, x], [0, y], color="#fb8500", linewidth=width, zorder=1, solid_capstyle="butt")
        colour = SERVER_COLOUR if link.name == "server" else WORKER_COLOUR
        ax.add_patch(Circle((x, y), 0.42, facecolor=colour, edgecolor="black", zorder=2))
        ax.text(x, y, link.name.replace(" ", "\n"), ha="center", va="center", fontsize=11, zorder=3)
        # The label beside a machine on the left or right, above or below one at the top or bottom.
        side = math.cos(angle) > 0.5 or math.cos(angle) < -0.5
        ax.text(
            x + math.copysign(0.52, math.cos(angle)) if side else x,
            y if side else y + math.copysign(0.62, math.sin(angle)),
            f"out {_megabytes(link.sends)}\nin {_megabytes(link.receives)}",
            fontsize=13,
            ha=("left" if math.cos(angle) > 0 else "right") if side else "center",
            va="center",
            weight="bold" if link.name == "server" else "normal",
        )
    if algorithm == "ring":
        # The ring's direction: rank r sends to rank r+1, round and round.
        for a, b in zip(angles, angles[1:] + angles[:1]):
            ax.add_patch(
                FancyArrowPatch(
                    (1.5 * math.cos(a), 1.5 * math.sin(a)),
                    (1.5 * math.cos(b), 1.5 * math.sin(b)),
                    connectionstyle="arc3,rad=-0.25",
                    arrowstyle="-|>",
                    mutation_scale=12,
                    shrinkA=24,
                    shrinkB=24,
                    color="0.35",
                    zorder=1,
                )
            )
    ax.set(xlim=(-3.4, 3.4), ylim=(-2.5, 2.5), aspect="equal")
    ax.axis("off")


def busiest_links(model_bytes: float, world_sizes: list[int]) -> dict[str, list[float]]:
    """Per world size, the bytes (in + out) on the busiest link: the parameter server's, a
    worker's, a ring rank's."""
    curves: dict[str, list[float]] = {"parameter server's link": [], "a worker's link": [], "a ring rank's link": []}
    for n in world_sizes:
        server, worker = link_loads("ps", n, model_bytes)[:2]
        rank = link_loads("ring", n, model_bytes)[0]
        for key, link in zip(curves, (server, worker, rank)):
            curves[key].append(link.sends + link.receives)
    return curves


def traffic_figure(model_bytes: float, world_size: int, world_sizes: list[int], title: str | None = None) -> Figure:
    """A parameter server and a ring of ``world_size`` machines, their links on one scale of
    width; then the busiest link's bytes against N over ``world_sizes``: the server's grows with
    N, a ring rank's stays under 4S (2S out, 2S in)."""
    fig = Figure(figsize=(16, 6), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 0.9])
    loads = {a: link_loads(a, world_size, model_bytes) for a in ("ps", "ring")}
    widest = max(link.sends + link.receives for links in loads.values() for link in links)
    for ax, algorithm in zip(axes, ("ps", "ring")):
        draw_links(ax, algorithm, loads[algorithm], widest)
        ax.set_title(_title(algorithm, loads[algorithm]), fontsize=16)
    ax = axes[2]
    styles = {
        "parameter server's link": ("o-", SERVER_COLOUR),
        "a worker's link": ("s--", "#219ebc"),
        "a ring rank's link": ("^-", "#fb8500"),
    }
    for label, values in busiest_links(model_bytes, world_sizes).items():
        marker, colour = styles[label]
        ax.plot(world_sizes, [v / MB for v in values], marker, color=colour, label=label, linewidth=2)
    ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
    ax.set_xlabel("machines N", fontsize=14)
    ax.set_ylabel("MB per step on the link (out + in)", fontsize=14)
    ax.set_title("The busiest link against N", fontsize=16)
    ax.tick_params(labelsize=12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=12.5)
    fig.suptitle(
        title
        or f"Averaging a gradient of S = {_megabytes(model_bytes)}: the bytes on each machine's link per step "
        "(line width: out + in)",
        fontsize=16,
    )
    return fig


def _title(algorithm: str, links: list[Link]) -> str:
    n = len(links) - 1 if algorithm == "ps" else len(links)
    name = f"parameter server, {n} workers" if algorithm == "ps" else f"ring all-reduce, {n} ranks"
    return name


def describe_traffic(model_bytes: float, world_size: int, world_sizes: list[int]) -> str:
    """The text alternative: what the server's, a worker's and a rank's link carry, and the busiest
    link's bytes against N."""
    server, worker = link_loads("ps", world_size, model_bytes)[:2]
    rank = link_loads("ring", world_size, model_bytes)[0]
    curves = "; ".join(
        f"{label}: " + ", ".join(f"{_megabytes(v)} at N = {n}" for n, v in zip(world_sizes, values))
        for label, values in busiest_links(model_bytes, world_sizes).items()
    )
    return (
        f"Each machine's link to a switch, drawn as thick as the bytes it carries per step to average "
        f"a gradient of S = {_megabytes(model_bytes)} over N = {world_size}: the parameter server's link "
        f"sends {_megabytes(server.sends)} and receives {_megabytes(server.receives)}, each worker's "
        f"{_megabytes(worker.sends)} each way; in a ring every rank's link carries {_megabytes(rank.sends)} "
        f"each way. The busiest link's bytes (out + in) against N: {curves}."
    )
